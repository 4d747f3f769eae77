"""The families tp reads are named once, in the C++ registry (src/models/model_families.cpp),
and Python reads it (tp.model_families(), tp.ModelType): every registered family has a
test folder made by transformers (hf_fixtures.py's Llama / Qwen2 / Qwen3, family_fixtures.py's
makers), every maker's family is registered, and the registry's mixture-of-experts flag
agrees with the maker's config."""

import pytest

import family_fixtures
import hf_fixtures
import tp


def test_python_reads_the_registry():
    families = tp.model_families()
    names = [f.model_type for f in families]
    assert len(set(names)) == len(names), names
    assert list(tp.ModelType.__members__) == names  # the enum's values come from the registry, in its order
    for f in families:
        assert tp.ModelType.__members__[f.model_type] == f.type
        assert f.model_type in repr(f)


def test_every_registered_family_has_a_transformers_fixture_and_no_fixture_is_unregistered():
    transformers = pytest.importorskip("transformers")
    registered = {f.model_type: f for f in tp.model_families()}
    fixtures = {}  # model_type -> fixture names
    for name, spec in family_fixtures.FAMILIES.items():
        model_type = getattr(transformers, spec["config_class"]).model_type
        assert model_type in registered, f"family_fixtures.py's {name!r} is {model_type!r}, which tp does not register"
        assert family_fixtures.is_moe(name) == registered[model_type].mixture_of_experts, name
        fixtures.setdefault(model_type, []).append(name)
    for name, spec in hf_fixtures.FLOAT_SPECS.items():
        assert spec["arch"] in registered, name
        assert not registered[spec["arch"]].mixture_of_experts, name
        fixtures.setdefault(spec["arch"], []).append(name)
    missing = sorted(set(registered) - set(fixtures))
    assert not missing, f"registered families without a fixture made by transformers: {missing}"
