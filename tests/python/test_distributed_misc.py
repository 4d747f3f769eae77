"""state_dict round trip at TP 2, the GIL released during a blocked forward, and a
collective timeout arriving as RuntimeError (one process per rank, gloo)."""

import launcher
import misc_checks


def test_state_dict_round_trip_tp2(tmp_path):
    for r, res in enumerate(launcher.run(2, misc_checks.state_dict_round_trip, str(tmp_path))):
        assert res["keys"] == ["down.bias", "down.weight", "gate_up.weight"], res
        assert res["differed_before"], f"rank {r}: two seeds gave the same model"
        assert not res["missing"] and not res["unexpected"], res
        assert res["equal_after"], f"rank {r}: outputs differ after load_state_dict"
        assert res["cpp_sees_loaded"], f"rank {r}: the C++ module does not see the loaded weights"


def test_forward_releases_gil():
    delay = 1.0
    res = launcher.run(2, misc_checks.gil_released_during_forward, delay)[0]
    # The forward really waited for the late rank...
    assert res["elapsed"] > 0.5 * delay, res
    # ... and another thread ran meanwhile (each tick sleeps 5 ms: ~200 if unhindered).
    assert res["ticks_during_forward"] >= 20, res


def test_collective_timeout_is_runtime_error():
    res = launcher.run(2, misc_checks.collective_timeout)[0]
    assert res["error"] is not None, "all_reduce without a peer did not fail"
    kind, message = res["error"]
    assert kind == "RuntimeError", res
    assert "tp::Communicator::all_reduce failed on rank 0 of world_size 2" in message, message
    assert "(timeout 500 ms)" in message, message


def test_layer_deleted_after_destroy_process_group_does_not_hang():
    for res in launcher.run(3, misc_checks.layer_outlives_process_group, timeout=60):
        assert res["y"] == (2, 4) and res["seconds"] < 10, res
