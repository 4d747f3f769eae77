// QuantConfig's text form and make_quant_method, read from the format table.

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

}  // namespace

std::vector<QuantFormat> all_quant_formats() {
  std::vector<QuantFormat> out;
  for (const auto& e : detail::format_table()) out.push_back(e.format);
  return out;
}

const char* to_string(QuantFormat format) { return detail::format_entry(format).name; }

std::string to_string(const QuantConfig& config) {
  std::string text = to_string(config.format);
  if (detail::format_entry(config.format).group_options) {
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
  const detail::FormatEntry* entry = nullptr;
  for (const auto& e : detail::format_table()) {
    if (fields[0] == e.name) entry = &e;
  }
  TORCH_CHECK_VALUE(entry != nullptr, "quant format: unknown format '", fields[0], "' in '", text,
                    "'; expected one of ", accepted_formats(), " (INT4 formats take ':g32|g64|g128' and ':sym|asym')");
  QuantConfig config;
  config.format = entry->format;
  for (size_t i = 1; i < fields.size(); ++i) {
    const std::string& f = fields[i];
    TORCH_CHECK_VALUE(entry->group_options, "quant format: '", text, "': only the INT4 formats take options; '",
                      fields[0], "' takes none");
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

std::shared_ptr<QuantMethod> make_quant_method(const QuantConfig& config) {
  return detail::format_entry(config.format).make_method(config);
}

}  // namespace tp
