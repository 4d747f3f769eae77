#include "tp/loader/fused_layout.h"

namespace tp {

const char* to_string(QKVLayout layout) {
  switch (layout) {
    case QKVLayout::kSeparate: return "separate q/k/v";
    case QKVLayout::kFused: return "fused [Q|K|V]";
    case QKVLayout::kInterleavedGroups: return "interleaved per KV group [q.. k v | q.. k v | ...]";
  }
  return "?";
}

const char* to_string(GateUpLayout layout) {
  switch (layout) {
    case GateUpLayout::kSeparate: return "separate gate/up";
    case GateUpLayout::kFused: return "fused [gate|up]";
  }
  return "?";
}

}  // namespace tp
