// ChatTemplate: a thin layer over llama.cpp's Jinja engine (the program is parsed once; every
// render gets its own context, as llama.cpp's common_chat_template_direct_apply does), fed what
// transformers' apply_chat_template passes a template: messages, add_generation_prompt and the
// named special tokens.
#include "fsdp/text/chat_template.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>

#include "fsdp/errors.h"
#include "fsdp/io/files.h"

// clang-format off
#ifndef FSDP_NO_CHAT_TEMPLATES
// The standard headers llama.cpp's include, first: declared outside the hidden region below.
#include <algorithm>
#include <cassert>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>
// llama.cpp's headers (cmake/FsdpLlamaJinja.cmake puts them on this file's include path only),
// hidden as the engine's objects are: nothing of it is exported from libfsdp_text.
#pragma GCC visibility push(hidden)
#include "jinja/lexer.h"
#include "jinja/parser.h"
#include "jinja/runtime.h"
#include "json.h"
#pragma GCC visibility pop
#endif
// clang-format on

namespace fsdp::text {
namespace chat_files {

bool is_file(const std::string& path) { return static_cast<bool>(std::ifstream(path)); }

nlohmann::json read_json(const std::string& path) {
  try {
    return nlohmann::json::parse(fsdp::io::read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(fmt::format("{}: not JSON ({})", path, e.what()));
  }
}

// transformers' SPECIAL_TOKENS_ATTRIBUTES: what apply_chat_template passes beside the messages.
constexpr const char* kSpecialTokenNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                              "pad_token", "cls_token", "mask_token"};

// A special token as tokenizer_config.json writes it: a string, or an AddedToken's dict.
void add_special_tokens(const nlohmann::json& j, std::map<std::string, std::string>& out) {
  for (const char* name : kSpecialTokenNames) {
    if (out.count(name) > 0 || !j.contains(name)) continue;
    const auto& v = j[name];
    if (v.is_string()) {
      out[name] = v.get<std::string>();
    } else if (v.is_object() && v.contains("content") && v["content"].is_string()) {
      out[name] = v["content"].get<std::string>();
    }
  }
}

// tokenizer_config.json's chat_template: a string, or named templates of which "default".
std::string template_from_config(const nlohmann::json& config, const std::string& path) {
  if (!config.contains("chat_template") || config["chat_template"].is_null()) return "";
  const auto& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    std::vector<std::string> names;
    for (const auto& e : t) {
      if (!e.is_object() || !e.contains("name") || !e.contains("template")) continue;
      names.push_back(e["name"].dump());
      if (e["name"] == "default" && e["template"].is_string()) {
        return e["template"].get<std::string>();
      }
    }
    throw InvalidArgument(
        fmt::format("{}: chat_template lists templates named [{}] but none named \"default\"", path,
                    fmt::join(names, ", ")));
  }
  throw InvalidArgument(
      fmt::format("{}: chat_template is neither a string nor a list of named templates", path));
}

#ifndef FSDP_NO_CHAT_TEMPLATES
// strftime_now as transformers defines it (datetime.now().strftime), through localtime_r: the
// engine's own calls std::localtime, whose shared buffer two renders on two threads would race on.
jinja::value strftime_now(const jinja::func_args& args) {
  args.ensure_vals<jinja::value_string>();
  const std::string format = args.get_pos(0)->as_string().str();
  std::tm local{};
  localtime_r(&args.ctx.current_time, &local);
  char buf[256];
  const size_t n = std::strftime(buf, sizeof(buf), format.c_str(), &local);
  if (n == 0 && !format.empty())
    throw jinja::raised_exception("strftime_now: failed to format time");
  return jinja::mk_val<jinja::value_string>(std::string(buf, n));
}
#else
[[noreturn]] void no_engine(const std::string& origin) {
  throw InvalidArgument(
      fmt::format("{}: this build of fsdp-cpp has no chat-template engine (it was configured with "
                  "-DFSDP_WITH_CHAT_TEMPLATES=OFF)",
                  origin));
}
#endif

}  // namespace chat_files

// Hidden, as the engine it holds (nothing of it is exported).
struct [[gnu::visibility("hidden")]] ChatTemplate::Impl {
  std::string source;  // as given (ChatTemplate::source)
  std::string lexed;   // as the lexer saw it (line ends normalized): error positions refer to it
  std::string origin;
  std::map<std::string, std::string> special_tokens;
#ifndef FSDP_NO_CHAT_TEMPLATES
  jinja::program program;
#endif
};

ChatTemplate::ChatTemplate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

ChatTemplate ChatTemplate::from_source(std::string source,
                                       std::map<std::string, std::string> special_tokens,
                                       std::string origin) {
#ifdef FSDP_NO_CHAT_TEMPLATES
  (void)source;
  (void)special_tokens;
  chat_files::no_engine(origin);
#else
  auto impl = std::make_unique<Impl>();
  try {
    jinja::lexer lexer;
    const auto tokens = lexer.tokenize(source);
    impl->program = jinja::parse_from_tokens(tokens);
    impl->lexed = tokens.source;
  } catch (const std::exception& e) {
    throw InvalidArgument(fmt::format("{}: the template does not parse: {}", origin, e.what()));
  }
  impl->source = std::move(source);
  impl->origin = std::move(origin);
  impl->special_tokens = std::move(special_tokens);
  return ChatTemplate(std::move(impl));
#endif
}

ChatTemplate ChatTemplate::from_directory(const std::string& dir) {
  const std::string config_path = dir + "/tokenizer_config.json";
  const std::string jinja_path = dir + "/chat_template.jinja";
  nlohmann::json config = nlohmann::json::object();
  if (chat_files::is_file(config_path)) config = chat_files::read_json(config_path);
  std::map<std::string, std::string> special;
  chat_files::add_special_tokens(config, special);
  const std::string map_path = dir + "/special_tokens_map.json";
  if (chat_files::is_file(map_path)) {
    chat_files::add_special_tokens(chat_files::read_json(map_path), special);
  }
  if (chat_files::is_file(jinja_path)) {
    return from_source(fsdp::io::read_file(jinja_path), std::move(special), jinja_path);
  }
  std::string source = chat_files::template_from_config(config, config_path);
  if (source.empty()) {
    throw InvalidArgument(fmt::format(
        "{} has no chat template: neither chat_template.jinja nor a \"chat_template\" in "
        "tokenizer_config.json (a base model has none; an instruct model's directory does)",
        dir));
  }
  return from_source(std::move(source), std::move(special), config_path);
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) const {
#ifdef FSDP_NO_CHAT_TEMPLATES
  (void)messages;
  (void)add_generation_prompt;
  chat_files::no_engine(impl_->origin);
#else
  common_json list = common_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role.empty()) {
      throw InvalidArgument(fmt::format("chat message {} has an empty role", i));
    }
    common_json m = common_json::object();
    m["role"] = messages[i].role;
    m["content"] = messages[i].content;
    list.push_back(m);
  }
  common_json input = common_json::object();
  for (const auto& [name, token] : impl_->special_tokens) input[name] = token;
  input["messages"] = list;
  // transformers passes these two always, None when there are none: a template's
  // `tools is defined` or `for tool in tools` sees what it sees there.
  input["tools"] = nullptr;
  input["documents"] = nullptr;
  input["add_generation_prompt"] = add_generation_prompt;
  try {
    jinja::context ctx(impl_->lexed);
    jinja::global_from_json(ctx, input, /*mark_input=*/false);
    ctx.set_val("strftime_now",
                jinja::mk_val<jinja::value_func>("strftime_now", chat_files::strftime_now));
    jinja::runtime runtime(ctx);
    const jinja::value results = runtime.execute(impl_->program);
    return jinja::runtime::gather_string_parts(results)->as_string().str();
  } catch (const std::exception& e) {
    throw InvalidArgument(fmt::format("{}: rendering {} messages failed: {}", impl_->origin,
                                      messages.size(), e.what()));
  }
#endif
}

const std::string& ChatTemplate::source() const { return impl_->source; }
const std::map<std::string, std::string>& ChatTemplate::special_tokens() const {
  return impl_->special_tokens;
}

}  // namespace fsdp::text
