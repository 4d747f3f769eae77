// Bindings: the vocabulary-parallel layers (VocabParallelEmbedding, ParallelLMHead),
// their partition, and the losses / decoding on local logits
// (tp/layers/vocab/loss.h). Bound over the Impls, held by std::shared_ptr, as
// the linear layers are (layers.cpp); the tp package wraps them in torch.nn.Modules.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "bindings.h"
#include "tp/comm/communicator.h"
#include "tp/layers/vocab/loss.h"
#include "tp/layers/vocab/parallel_lm_head.h"
#include "tp/layers/vocab/vocab_parallel_embedding.h"
#include "tp/loader/checkpoint.h"
#include "tp/shard/vocab.h"

namespace py = pybind11;

namespace tp::python {
namespace {

using Release = py::call_guard<py::gil_scoped_release>;

#define TP_OPTION(cls, Options, field)                    \
  cls.def_property(                                       \
      #field, [](const Options& o) { return o.field(); }, \
      [](Options& o, std::decay_t<decltype(std::declval<const Options&>().field())> v) { o.field(std::move(v)); })

void bind_partition(py::module_& m) {
  py::class_<VocabPartition>(m, "VocabPartition", "How a vocabulary is split over ranks (padding included).")
      .def_readonly("vocab_size", &VocabPartition::vocab_size)
      .def_readonly("padded_size", &VocabPartition::padded_size)
      .def_readonly("pad_to_multiple_of", &VocabPartition::pad_to_multiple_of)
      .def_readonly("ranges", &VocabPartition::ranges)
      .def_property_readonly("world_size", &VocabPartition::world_size)
      .def("range", &VocabPartition::range, py::arg("rank"), "Rank r's rows of the padded table.")
      .def("real", &VocabPartition::real, py::arg("rank"), "Rank r's real tokens (no padding).")
      .def("owner", &VocabPartition::owner, py::arg("token"), "The rank that owns a token id.")
      .def("__repr__", [](const VocabPartition& p) {
        return to_repr([&](std::ostream& o) {
          o << "tp.VocabPartition(vocab_size=" << p.vocab_size << ", padded_size=" << p.padded_size << ", ranges=[";
          for (size_t r = 0; r < p.ranges.size(); ++r) o << (r ? ", " : "") << p.ranges[r];
          o << "])";
        });
      });
  m.def("partition_vocab", &partition_vocab, py::arg("vocab_size"), py::arg("world_size"),
        py::arg("pad_to_multiple_of") = 1, py::arg("weights") = std::vector<double>{},
        "The vocabulary's split: padded to a multiple of pad_to_multiple_of, split in whole units of it "
        "(by the per-rank weights when given).");
}

// What the two vocabulary layers bind alike: construction from Options and a
// Communicator (without the GIL), loading and gathering, their tensors and partition.
template <typename Options, typename Impl>
void bind_vocab_common(py::class_<Impl, std::shared_ptr<Impl>>& cls) {
  cls.def(py::init([](Options options, const Communicator& comm) {
            Impl* impl = nullptr;
            {
              py::gil_scoped_release no_gil;
              impl = new Impl(std::move(options), comm);
            }
            return release_gil_on_delete(impl);
          }),
          py::arg("options"), py::arg("communicator"))
      .def(
          "load_weights",
          [](Impl& layer, const Checkpoint& checkpoint, const std::string& prefix) {
            layer.load_weights(checkpoint, prefix);
          },
          py::arg("checkpoint"), py::arg("prefix"), Release())
      .def("gather_weights", &Impl::gather_weights, py::arg("prefix"), Release())
      .def("reset_parameters", &Impl::reset_parameters)
      .def_readonly("options", &Impl::options)
      .def_property_readonly("communicator",
                             [](const Impl& layer) { return release_gil_on_delete(new Communicator(layer.comm)); })
      .def_property_readonly("weight", [](const Impl& layer) { return layer.weight; })
      .def_property_readonly("partition", &Impl::partition)
      .def("local_range", &Impl::local_range)
      .def("vocab_range", &Impl::vocab_range)
      .def("named_parameters", &own_parameters<Impl>)
      .def_property_readonly("lora", &lora_of<Impl>,
                             "The layer's LoRA adapters (tp/layers/lora/lora.h), cut with the vocabulary.")
      .def("__repr__", [](const Impl& layer) { return to_repr([&](std::ostream& o) { layer.pretty_print(o); }); });
}

void bind_embedding(py::module_& m) {
  using Options = VocabParallelEmbeddingOptions;
  using Impl = VocabParallelEmbeddingImpl;
  py::class_<Options> opts(m, "VocabParallelEmbeddingOptions", "Options of VocabParallelEmbedding; sizes are GLOBAL.");
  opts.def(py::init<int64_t, int64_t>(), py::arg("num_embeddings"), py::arg("embedding_dim"));
  TP_OPTION(opts, Options, num_embeddings);
  TP_OPTION(opts, Options, embedding_dim);
  TP_OPTION(opts, Options, pad_to_multiple_of);
  TP_OPTION(opts, Options, split_weights);
  TP_OPTION(opts, Options, sequence_parallel);
  TP_OPTION(opts, Options, dtype);
  TP_OPTION(opts, Options, device);
  TP_OPTION(opts, Options, init_weights);

  py::class_<Impl, std::shared_ptr<Impl>> cls(m, "VocabParallelEmbedding",
                                              "An embedding table with its rows (the vocabulary) split over ranks.");
  cls.def(
      "forward", [](Impl& layer, const at::Tensor& ids) { return layer.forward(ids); }, py::arg("ids"), Release());
  bind_vocab_common<Options>(cls);
}

void bind_head(py::module_& m) {
  using Options = ParallelLMHeadOptions;
  using Impl = ParallelLMHeadImpl;
  py::class_<Options> opts(m, "ParallelLMHeadOptions", "Options of ParallelLMHead; sizes are GLOBAL.");
  opts.def(py::init<int64_t, int64_t>(), py::arg("hidden_size"), py::arg("vocab_size"));
  TP_OPTION(opts, Options, hidden_size);
  TP_OPTION(opts, Options, vocab_size);
  TP_OPTION(opts, Options, pad_to_multiple_of);
  TP_OPTION(opts, Options, split_weights);
  TP_OPTION(opts, Options, gather_output);
  TP_OPTION(opts, Options, dtype);
  TP_OPTION(opts, Options, device);
  TP_OPTION(opts, Options, init_weights);

  py::class_<Impl, std::shared_ptr<Impl>> cls(
      m, "ParallelLMHead", "Logits over a vocabulary split over ranks (column-parallel), maybe tied.");
  bind_vocab_common<Options>(cls);
  cls.def(py::init([](const std::shared_ptr<VocabParallelEmbeddingImpl>& embedding, bool gather_output) {
            TORCH_CHECK_VALUE(embedding != nullptr, "ParallelLMHead: expected a tp.VocabParallelEmbedding");
            return release_gil_on_delete(new Impl(VocabParallelEmbedding(embedding), gather_output));
          }),
          py::arg("embedding"), py::arg("gather_output") = false)
      .def(
          "forward", [](Impl& layer, const at::Tensor& x) { return layer.forward(x); }, py::arg("input"), Release())
      .def("cross_entropy", &Impl::cross_entropy, py::arg("local_logits"), py::arg("target"),
           py::arg("ignore_index") = -100, Release())
      .def("argmax", &Impl::argmax, py::arg("local_logits"), Release())
      .def_property_readonly("tied", &Impl::tied);

  m.def(
      "vocab_parallel_cross_entropy",
      [](const at::Tensor& logits, const at::Tensor& target, const VocabPartition& partition, const Communicator& comm,
         int64_t ignore_index, const std::string& numerics) {
        return vocab_parallel_cross_entropy(logits, target, partition, comm, ignore_index, parse_numerics(numerics));
      },
      py::arg("local_logits"), py::arg("target"), py::arg("partition"), py::arg("communicator"),
      py::arg("ignore_index") = -100, py::arg("numerics") = "default", Release(),
      "Per-row cross entropy from this rank's local logits (Megatron's vocab-parallel cross entropy).");
  m.def("vocab_parallel_argmax", &vocab_parallel_argmax, py::arg("local_logits"), py::arg("partition"),
        py::arg("communicator"), Release(), "The argmax over the whole vocabulary from the local logits.");
}

#undef TP_OPTION

}  // namespace

void init_vocab(py::module_& m) {
  bind_partition(m);
  bind_embedding(m);
  bind_head(m);
}

}  // namespace tp::python
