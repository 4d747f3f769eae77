#include "tp/quant/quant_method.h"

#include <c10/util/Exception.h>

#include <sstream>

#include "quant/formats.h"
#include "tp/quant/unquantized.h"

namespace tp {

namespace {

constexpr QuantFormat kAllFormats[] = {
    QuantFormat::kNone,     QuantFormat::kFp8PerTensor,   QuantFormat::kFp8PerChannel, QuantFormat::kFp8Block,
    QuantFormat::kInt8W8A8, QuantFormat::kInt8WeightOnly, QuantFormat::kInt4Gptq,      QuantFormat::kInt4Awq,
};

std::string accepted_formats() {
  std::ostringstream out;
  for (size_t i = 0; i < std::size(kAllFormats); ++i) out << (i ? ", " : "") << to_string(kAllFormats[i]);
  return out.str();
}

}  // namespace

const char* to_string(QuantFormat format) {
  switch (format) {
    case QuantFormat::kNone: return "none";
    case QuantFormat::kFp8PerTensor: return "fp8_tensor";
    case QuantFormat::kFp8PerChannel: return "fp8_channel";
    case QuantFormat::kFp8Block: return "fp8_block";
    case QuantFormat::kInt8W8A8: return "int8_w8a8";
    case QuantFormat::kInt8WeightOnly: return "int8_weight_only";
    case QuantFormat::kInt4Gptq: return "int4_gptq";
    case QuantFormat::kInt4Awq: return "int4_awq";
  }
  return "unknown";
}

std::string to_string(const QuantConfig& config) {
  std::string text = to_string(config.format);
  if (detail::family_of(config.format) == detail::FormatFamily::kInt4) {
    text += ":g" + std::to_string(config.group_size) + (config.symmetric ? ":sym" : ":asym");
  }
  return text;
}

QuantConfig parse_quant_config(const std::string& text) {
  std::vector<std::string> fields;
  std::string field;
  std::istringstream in(text);
  while (std::getline(in, field, ':')) fields.push_back(field);
  TORCH_CHECK_VALUE(!fields.empty(), "quant format: empty text; expected one of ", accepted_formats());
  QuantConfig config;
  bool found = false;
  for (QuantFormat format : kAllFormats) {
    if (fields[0] == to_string(format)) {
      config.format = format;
      found = true;
    }
  }
  TORCH_CHECK_VALUE(found, "quant format: unknown format '", fields[0], "' in '", text, "'; expected one of ",
                    accepted_formats(), " (INT4 formats take ':g32|g64|g128' and ':sym|asym')");
  const bool int4 = detail::family_of(config.format) == detail::FormatFamily::kInt4;
  for (size_t i = 1; i < fields.size(); ++i) {
    const std::string& f = fields[i];
    TORCH_CHECK_VALUE(int4, "quant format: '", text, "': only the INT4 formats take options; '", fields[0],
                      "' takes none");
    if (f == "sym" || f == "asym") {
      config.symmetric = f == "sym";
    } else if (f.size() > 1 && f[0] == 'g' && f.find_first_not_of("0123456789", 1) == std::string::npos) {
      config.group_size = std::stoll(f.substr(1));
    } else {
      TORCH_CHECK_VALUE(false, "quant format: '", text, "': unknown option '", f,
                        "'; expected g32, g64, g128, sym or asym");
    }
  }
  return config;
}

namespace detail {

FormatFamily family_of(QuantFormat format) {
  switch (format) {
    case QuantFormat::kNone: return FormatFamily::kNone;
    case QuantFormat::kFp8PerTensor:
    case QuantFormat::kFp8PerChannel:
    case QuantFormat::kFp8Block: return FormatFamily::kFp8;
    case QuantFormat::kInt8W8A8:
    case QuantFormat::kInt8WeightOnly: return FormatFamily::kInt8;
    case QuantFormat::kInt4Gptq:
    case QuantFormat::kInt4Awq: return FormatFamily::kInt4;
  }
  TORCH_CHECK_VALUE(false, "unknown quant format ", static_cast<int>(format));
}

}  // namespace detail

std::shared_ptr<QuantMethod> make_quant_method(const QuantConfig& config) {
  switch (detail::family_of(config.format)) {
    case detail::FormatFamily::kNone: return std::make_shared<UnquantizedMethod>();
    case detail::FormatFamily::kFp8: return detail::make_fp8_method(config);
    case detail::FormatFamily::kInt8: return detail::make_int8_method(config);
    case detail::FormatFamily::kInt4: return detail::make_int4_method(config);
  }
  TORCH_CHECK_VALUE(false, "unknown quant format ", static_cast<int>(config.format));
}

}  // namespace tp
