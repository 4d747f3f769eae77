// QuantConfig's text form, equality and make_quant_method, read from the format table.

#include "tp/quant/quant_config.h"

#include <c10/util/Exception.h>

#include <sstream>

#include "quant/format_table.h"
#include "tp/quant/quant_method.h"

namespace tp {

namespace {

std::string accepted_formats() {
  std::ostringstream out;
  bool first = true;
  for (const auto& e : detail::format_table()) {
    out << (first ? "" : ", ") << e.name;
    first = false;
  }
  return out.str();
}

// The options a format takes, as the text form spells them.
std::string accepted_options(unsigned options) {
  std::string out;
  const auto add = [&](const char* text) { out += (out.empty() ? "" : ", ") + std::string(text); };
  if (options & detail::kGroupOption) add("g32, g64, g128");
  if (options & detail::kSymmetryOption) add("sym, asym");
  if (options & detail::kGptqFormatOption) add("v1, v2");
  if (options & detail::kBlockScaleNameOption) add("weight_scale_inv, weight_scale");
  if (options & detail::kDialectOption) add("compressed_tensors, modelopt");
  return out.empty() ? "none" : out;
}

}  // namespace

std::vector<QuantFormat> all_quant_formats() {
  std::vector<QuantFormat> out;
  for (const auto& e : detail::format_table()) out.push_back(e.format);
  return out;
}

const char* to_string(QuantFormat format) { return detail::format_entry(format).name; }

const char* to_string(GptqFormat format) { return format == GptqFormat::kV2 ? "v2" : "v1"; }

const char* to_string(BlockScaleName name) {
  return name == BlockScaleName::kWeightScale ? "weight_scale" : "weight_scale_inv";
}

const char* to_string(Nvfp4Dialect dialect) {
  return dialect == Nvfp4Dialect::kModelOpt ? "modelopt" : "compressed_tensors";
}

bool QuantConfig::operator==(const QuantConfig& other) const {
  if (format != other.format) return false;
  const unsigned options = detail::format_entry(format).options;
  return (!(options & detail::kGroupOption) || group_size == other.group_size) &&
         (!(options & detail::kSymmetryOption) || symmetric == other.symmetric) &&
         (!(options & detail::kGptqFormatOption) || gptq_format == other.gptq_format) &&
         (!(options & detail::kBlockScaleNameOption) || block_scale_name == other.block_scale_name) &&
         (!(options & detail::kDialectOption) || nvfp4_dialect == other.nvfp4_dialect);
}

std::string to_string(const QuantConfig& config) {
  const unsigned options = detail::format_entry(config.format).options;
  std::string text = to_string(config.format);
  if (options & detail::kGroupOption) text += ":g" + std::to_string(config.group_size);
  if (options & detail::kSymmetryOption) text += config.symmetric ? ":sym" : ":asym";
  if ((options & detail::kGptqFormatOption) && config.gptq_format != GptqFormat::kV1)
    text += std::string(":") + to_string(config.gptq_format);
  if ((options & detail::kBlockScaleNameOption) && config.block_scale_name != BlockScaleName::kWeightScaleInv)
    text += std::string(":") + to_string(config.block_scale_name);
  if ((options & detail::kDialectOption) && config.nvfp4_dialect != Nvfp4Dialect::kCompressedTensors)
    text += std::string(":") + to_string(config.nvfp4_dialect);
  return text;
}

QuantConfig parse_quant_config(const std::string& text) {
  std::vector<std::string> fields;
  std::string field;
  std::istringstream in(text);
  while (std::getline(in, field, ':')) fields.push_back(field);
  TORCH_CHECK_VALUE(!fields.empty(), "quant format: empty text; expected one of ", accepted_formats());
  const detail::FormatEntry* entry = nullptr;
  for (const auto& e : detail::format_table()) {
    if (fields[0] == e.name) entry = &e;
  }
  TORCH_CHECK_VALUE(entry != nullptr, "quant format: unknown format '", fields[0], "' in '", text,
                    "'; expected one of ", accepted_formats(),
                    " (INT4 formats take ':g32|g64|g128' and ':sym|asym', int4_gptq ':v1|v2', fp8_block "
                    "':weight_scale_inv|weight_scale', nvfp4 ':compressed_tensors|modelopt')");
  QuantConfig config;
  config.format = entry->format;
  for (size_t i = 1; i < fields.size(); ++i) {
    const std::string& f = fields[i];
    unsigned option = detail::kNoOptions;
    if (f == "sym" || f == "asym") {
      option = detail::kSymmetryOption;
      config.symmetric = f == "sym";
    } else if (f.size() > 1 && f.size() < 8 && f[0] == 'g' &&
               f.find_first_not_of("0123456789", 1) == std::string::npos) {
      option = detail::kGroupOption;
      config.group_size = std::stoll(f.substr(1));
    } else if (f == "v1" || f == "v2") {
      option = detail::kGptqFormatOption;
      config.gptq_format = f == "v2" ? GptqFormat::kV2 : GptqFormat::kV1;
    } else if (f == "weight_scale_inv" || f == "weight_scale") {
      option = detail::kBlockScaleNameOption;
      config.block_scale_name = f == "weight_scale" ? BlockScaleName::kWeightScale : BlockScaleName::kWeightScaleInv;
    } else if (f == "compressed_tensors" || f == "modelopt") {
      option = detail::kDialectOption;
      config.nvfp4_dialect = f == "modelopt" ? Nvfp4Dialect::kModelOpt : Nvfp4Dialect::kCompressedTensors;
    }
    TORCH_CHECK_VALUE(option != detail::kNoOptions, "quant format: '", text, "': unknown option '", f, "'; ", fields[0],
                      " takes ", accepted_options(entry->options));
    TORCH_CHECK_VALUE(entry->options & option, "quant format: '", text, "': ", fields[0], " does not take '", f,
                      "'; it takes ", accepted_options(entry->options));
  }
  return config;
}

std::shared_ptr<QuantMethod> make_quant_method(const QuantConfig& config) {
  return detail::format_entry(config.format).make_method(config);
}

int64_t tp_alignment(const QuantConfig& config, ShardMode mode) {
  return detail::format_entry(config.format).alignment(config, mode);
}

bool splits_by_rows(const QuantConfig& config) { return detail::format_entry(config.format).rows_first; }

}  // namespace tp
