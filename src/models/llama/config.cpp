// config.json in and out (llama_config.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fsdp/errors.h"
#include "fsdp/models/llama_config.h"
#include "model_check.h"

namespace fsdp::models::llama {
namespace {

using nlohmann::json;

// Reads fields of one config.json, naming the file and the field in every message.
class Fields {
 public:
  Fields(const json& j, const std::string& source) : j_(j), source_(source) {}

  bool contains(const char* key) const { return j_.contains(key); }
  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  const json& at(const char* key) const { return j_.at(key); }

  [[noreturn]] void fail(const std::string& what) const {
    throw InvalidArgument(fmt::format("{}: {}", source_, what));
  }
  void require(const char* key) const {
    if (!has(key)) fail(fmt::format("no \"{}\" (required)", key));
  }
  int64_t integer(const char* key, int64_t fallback) const {
    if (!has(key)) return fallback;
    return as_integer(at(key), key);
  }
  int64_t as_integer(const json& v, const std::string& key) const {
    if (!v.is_number_integer())
      fail(fmt::format("\"{}\" is {}, expected an integer", key, v.dump()));
    return v.get<int64_t>();
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    if (!at(key).is_number())
      fail(fmt::format("\"{}\" is {}, expected a number", key, at(key).dump()));
    return at(key).get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!at(key).is_boolean())
      fail(fmt::format("\"{}\" is {}, expected true or false", key, at(key).dump()));
    return at(key).get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!at(key).is_string())
      fail(fmt::format("\"{}\" is {}, expected a string", key, at(key).dump()));
    return at(key).get<std::string>();
  }
  std::optional<int64_t> token_id(const char* key, std::optional<int64_t> fallback) const {
    if (!j_.contains(key)) return fallback;
    if (at(key).is_null()) return std::nullopt;
    return as_integer(at(key), key);
  }

 private:
  const json& j_;
  const std::string& source_;
};

// Transformers' defaults for the fields whose defaults differ between the accepted types.
struct TypeDefaults {
  int64_t max_position_embeddings;
  std::optional<int64_t> bos, eos;
};
TypeDefaults defaults_of(const std::string& model_type) {
  if (model_type == "mistral") return {131072, 1, 2};
  if (model_type == "qwen2") return {32768, std::nullopt, std::nullopt};
  return {2048, 1, 2};
}

// The rotary parameters (llama_config.h): transformers 5.24 takes "rope_scaling" when it is a
// non-empty object and "rope_parameters" otherwise (convert_rope_params_to_dict), never a mix.
void read_rope(const Fields& f, Config& c) {
  const auto usable = [&](const char* key) {
    return f.has(key) && !(f.at(key).is_object() && f.at(key).empty());
  };
  if (f.has("partial_rotary_factor") && f.number("partial_rotary_factor", 1.0) != 1.0) {
    f.fail(
        fmt::format("\"partial_rotary_factor\" is {}: a partial rotary embedding is not "
                    "implemented (only 1)",
                    f.at("partial_rotary_factor").dump()));
  }
  const char* key = usable("rope_scaling") ? "rope_scaling" : "rope_parameters";
  if (!f.has(key)) return;
  const json& rope = f.at(key);
  if (!rope.is_object()) f.fail(fmt::format("\"{}\" is {}, expected an object", key, rope.dump()));
  auto number = [&](const char* field) -> std::optional<double> {
    if (!rope.contains(field) || rope[field].is_null()) return std::nullopt;
    if (!rope[field].is_number()) {
      f.fail(fmt::format("\"{}.{}\" is {}, expected a number", key, field, rope[field].dump()));
    }
    return rope[field].get<double>();
  };
  auto required = [&](const char* field, const std::string& type) {
    auto v = number(field);
    if (!v) f.fail(fmt::format("\"{}\": rope type \"{}\" needs \"{}\"", key, type, field));
    return *v;
  };
  // A whole number, also when written 8192.0 (transformers only warns about a float).
  auto whole = [&](const json& v, const std::string& name) -> int64_t {
    if (v.is_number_float() && v.get<double>() == std::floor(v.get<double>())) {
      return static_cast<int64_t>(v.get<double>());
    }
    return f.as_integer(v, name);
  };
  RopeScaling& r = c.rope_scaling;
  // rope_type, else type, else "default" (standardize_rope_params); a null one is refused, as
  // transformers then fails when it builds the model.
  for (const char* type_key : {"rope_type", "type"}) {
    if (!rope.contains(type_key)) continue;
    if (!rope[type_key].is_string()) {
      f.fail(
          fmt::format("\"{}.{}\" is {}, expected a string", key, type_key, rope[type_key].dump()));
    }
    r.type = rope[type_key].get<std::string>();
    break;
  }
  if (r.type == "linear") {
    r.factor = required("factor", r.type);
  } else if (r.type == "llama3") {
    r.factor = required("factor", r.type);
    r.low_freq_factor = required("low_freq_factor", r.type);
    r.high_freq_factor = required("high_freq_factor", r.type);
    // transformers takes a top-level original_max_position_embeddings first (as Phi-3 writes
    // it), then the rope object's, then max_position_embeddings (standardize_rope_params).
    r.original_max_position_embeddings = c.max_position_embeddings;
    if (f.has("original_max_position_embeddings")) {
      r.original_max_position_embeddings =
          whole(f.at("original_max_position_embeddings"), "original_max_position_embeddings");
    } else if (rope.contains("original_max_position_embeddings") &&
               !rope["original_max_position_embeddings"].is_null()) {
      r.original_max_position_embeddings =
          whole(rope["original_max_position_embeddings"],
                fmt::format("{}.original_max_position_embeddings", key));
    }
  } else if (r.type != "default") {
    f.fail(
        fmt::format("\"{}\": rope type \"{}\" is not implemented (implemented: \"default\", "
                    "\"linear\", \"llama3\")",
                    key, r.type));
  }
  // In the rope object too (a top-level one is checked above; transformers moves it here).
  if (auto partial = number("partial_rotary_factor"); partial && *partial != 1.0) {
    f.fail(fmt::format("\"{}\": partial_rotary_factor {} is not implemented (only 1)", key,
                       rope["partial_rotary_factor"].dump()));
  }
  if (rope.contains("rope_theta") && rope["rope_theta"].is_null()) {
    f.fail(fmt::format("\"{}.rope_theta\" is null, expected a number", key));
  }
  if (auto theta = number("rope_theta")) c.rope_theta = *theta;
}

// Sliding-window attention changes the causal mask; accepted only where no layer uses it.
void check_sliding_window(const Fields& f, const Config& c) {
  if (c.model_type == "qwen2") {
    if (f.has("layer_types")) {
      const json& types = f.at("layer_types");
      if (!types.is_array()) f.fail("\"layer_types\" is not a list");
      for (size_t i = 0; i < types.size(); ++i) {
        if (types[i] != json("full_attention")) {
          f.fail(
              fmt::format("\"layer_types\"[{}] is {}: sliding-window attention is not "
                          "implemented (only \"full_attention\")",
                          i, types[i].dump()));
        }
      }
    } else if (f.boolean("use_sliding_window", false)) {
      f.fail("\"use_sliding_window\" is true: sliding-window attention is not implemented");
    }
    return;
  }
  // MistralConfig's default is a window of 4096: only an explicit null means none.
  const bool mistral_default = c.model_type == "mistral" && !f.contains("sliding_window");
  if (f.has("sliding_window") || mistral_default) {
    f.fail(
        fmt::format("\"sliding_window\" is {}: sliding-window attention is not implemented "
                    "(only null)",
                    f.has("sliding_window") ? f.at("sliding_window").dump()
                                            : "absent (mistral's default 4096)"));
  }
}

const char* const kModelTypes[] = {"llama", "mistral", "qwen2"};

bool known_model_type(const std::string& t) {
  for (const char* k : kModelTypes) {
    if (t == k) return true;
  }
  return false;
}

}  // namespace

int64_t Config::head_size() const {
  return head_dim > 0 ? head_dim : num_attention_heads > 0 ? hidden_size / num_attention_heads : 0;
}

std::string Config::architecture() const {
  if (model_type == "mistral") return "MistralForCausalLM";
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  return "LlamaForCausalLM";
}

void validate(const Config& c) {
  FSDP_MODEL_CHECK(known_model_type(c.model_type),
                   "llama config: model_type \"{}\" is not implemented (accepted: llama, mistral, "
                   "qwen2: the architectures whose math is Llama's)",
                   c.model_type);
  const std::pair<const char*, int64_t> sizes[] = {
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"max_position_embeddings", c.max_position_embeddings}};
  for (const auto& [name, value] : sizes) {
    // No layers is a valid (if useless) model: the embedding, the final norm and the head.
    const int64_t least = std::string(name) == "num_hidden_layers" ? 0 : 1;
    FSDP_MODEL_CHECK(value >= least, "llama config: {} is {}, expected at least {}", name, value,
                     least);
  }
  FSDP_MODEL_CHECK(c.head_dim >= 0, "llama config: head_dim is {}, expected a positive size",
                   c.head_dim);
  FSDP_MODEL_CHECK(c.head_dim > 0 || c.hidden_size % c.num_attention_heads == 0,
                   "llama config: hidden_size {} does not divide by num_attention_heads {} (and no "
                   "head_dim is given)",
                   c.hidden_size, c.num_attention_heads);
  FSDP_MODEL_CHECK(c.num_attention_heads % c.num_key_value_heads == 0,
                   "llama config: num_attention_heads {} does not divide by num_key_value_heads {} "
                   "(each key/value head serves a whole group of query heads)",
                   c.num_attention_heads, c.num_key_value_heads);
  FSDP_MODEL_CHECK(c.head_size() % 2 == 0,
                   "llama config: the head size {} is odd; rotary embeddings rotate pairs",
                   c.head_size());
  FSDP_MODEL_CHECK(c.hidden_act == "silu",
                   "llama config: hidden_act \"{}\" is not implemented (only \"silu\")",
                   c.hidden_act);
  FSDP_MODEL_CHECK(c.rms_norm_eps > 0, "llama config: rms_norm_eps is {}, expected > 0",
                   c.rms_norm_eps);
  FSDP_MODEL_CHECK(c.rope_theta > 0, "llama config: rope_theta is {}, expected > 0", c.rope_theta);
  const RopeScaling& r = c.rope_scaling;
  FSDP_MODEL_CHECK(r.type == "default" || r.type == "linear" || r.type == "llama3",
                   "llama config: rope type \"{}\" is not implemented (implemented: \"default\", "
                   "\"linear\", \"llama3\")",
                   r.type);
  if (r.type != "default") {
    FSDP_MODEL_CHECK(r.factor > 0, "llama config: rope factor is {}, expected > 0", r.factor);
  }
  if (r.type == "llama3") {
    // The smoothing divides by high - low and the wavelength bounds by each factor.
    FSDP_MODEL_CHECK(r.low_freq_factor > 0 && r.high_freq_factor > r.low_freq_factor,
                     "llama config: llama3 rope low_freq_factor {} and high_freq_factor {}, "
                     "expected 0 < low < high",
                     r.low_freq_factor, r.high_freq_factor);
    FSDP_MODEL_CHECK(
        r.original_max_position_embeddings > 0,
        "llama config: llama3 rope original_max_position_embeddings is {}, expected > 0",
        r.original_max_position_embeddings);
  }
  FSDP_MODEL_CHECK(c.initializer_range >= 0, "llama config: initializer_range is {}, expected >= 0",
                   c.initializer_range);
  FSDP_MODEL_CHECK(c.model_type != "mistral" || (!c.attention_bias && !c.mlp_bias),
                   "llama config: mistral has no attention or MLP biases");
  FSDP_MODEL_CHECK(c.model_type != "qwen2" || !c.mlp_bias, "llama config: qwen2 has no MLP bias");
  auto check_token = [&](const char* name, int64_t id) {
    FSDP_MODEL_CHECK(0 <= id && id < c.vocab_size,
                     "llama config: {} {} is outside the vocabulary of {} tokens", name, id,
                     c.vocab_size);
  };
  if (c.bos_token_id) check_token("bos_token_id", *c.bos_token_id);
  for (auto id : c.eos_token_ids) check_token("eos_token_id", id);
  if (c.pad_token_id) check_token("pad_token_id", *c.pad_token_id);
}

Config from_hf_json(const std::string& json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    throw FormatError(fmt::format("{}: not valid JSON: {}", source, e.what()));
  }
  if (!j.is_object()) throw FormatError(fmt::format("{}: not a JSON object", source));
  Fields f(j, source);
  Config c;
  c.model_type = f.string("model_type", "");
  if (!known_model_type(c.model_type)) {
    f.fail(
        fmt::format("model_type {} is not implemented (accepted: llama, mistral, qwen2: the "
                    "architectures whose math is Llama's)",
                    f.has("model_type") ? f.at("model_type").dump() : "absent"));
  }
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads"}) {
    f.require(key);
  }
  if (c.model_type != "llama") f.require("num_key_value_heads");
  const auto d = defaults_of(c.model_type);
  c.vocab_size = f.integer("vocab_size", 0);
  c.hidden_size = f.integer("hidden_size", 0);
  c.intermediate_size = f.integer("intermediate_size", 0);
  c.num_hidden_layers = f.integer("num_hidden_layers", 0);
  c.num_attention_heads = f.integer("num_attention_heads", 0);
  c.num_key_value_heads = f.integer("num_key_value_heads", c.num_attention_heads);
  c.head_dim = f.integer("head_dim", 0);
  if (f.has("head_dim") && c.head_dim <= 0) {
    f.fail(fmt::format("\"head_dim\" is {}, expected a positive size", c.head_dim));
  }
  c.max_position_embeddings = f.integer("max_position_embeddings", d.max_position_embeddings);
  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  c.rope_theta = f.number("rope_theta", 10000.0);
  read_rope(f, c);
  check_sliding_window(f, c);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.attention_bias = f.boolean("attention_bias", false);
  c.mlp_bias = f.boolean("mlp_bias", false);
  c.bos_token_id = f.token_id("bos_token_id", d.bos);
  c.eos_token_ids.clear();
  if (f.has("eos_token_id") && f.at("eos_token_id").is_array()) {
    for (const auto& v : f.at("eos_token_id"))
      c.eos_token_ids.push_back(f.as_integer(v, "eos_token_id"));
  } else if (auto eos = f.token_id("eos_token_id", d.eos)) {
    c.eos_token_ids.push_back(*eos);
  }
  c.pad_token_id = f.token_id("pad_token_id", std::nullopt);
  c.initializer_range = f.number("initializer_range", 0.02);
  c.hidden_act = f.string("hidden_act", "silu");
  c.dtype = f.string("dtype", f.string("torch_dtype", "float32"));
  if (f.number("attention_dropout", 0.0) != 0.0) {
    f.fail(
        fmt::format("\"attention_dropout\" is {}: attention dropout is not implemented "
                    "(only 0)",
                    f.at("attention_dropout").dump()));
  }
  if (f.integer("pretraining_tp", 1) > 1) {
    f.fail(
        fmt::format("\"pretraining_tp\" is {}: projections computed in slices are not "
                    "implemented (only 1)",
                    f.at("pretraining_tp").dump()));
  }
  if (c.hidden_act != "silu") {
    f.fail(fmt::format("\"hidden_act\" is \"{}\": only \"silu\" is implemented", c.hidden_act));
  }
  try {
    validate(c);
  } catch (const InvalidArgument& e) {
    f.fail(e.what());
  }
  return c;
}

Config read_hf_config(const std::string& path) {
  std::string file = path;
  {
    std::ifstream probe(path + "/config.json");
    if (probe) file = path + "/config.json";
  }
  std::ifstream in(file);
  FSDP_MODEL_CHECK(static_cast<bool>(in), "cannot read the model config {}", file);
  std::stringstream text;
  text << in.rdbuf();
  return from_hf_json(text.str(), file);
}

std::string to_hf_json(const Config& c) {
  validate(c);
  json j;  // an std::map underneath: keys sorted, as transformers writes them
  j["architectures"] = {c.architecture()};
  j["attention_bias"] = c.attention_bias;
  j["attention_dropout"] = 0.0;
  j["bos_token_id"] = c.bos_token_id ? json(*c.bos_token_id) : json(nullptr);
  j["dtype"] = c.dtype;
  j["eos_token_id"] = c.eos_token_ids.empty()       ? json(nullptr)
                      : c.eos_token_ids.size() == 1 ? json(c.eos_token_ids[0])
                                                    : json(c.eos_token_ids);
  j["head_dim"] = c.head_size();
  j["hidden_act"] = c.hidden_act;
  j["hidden_size"] = c.hidden_size;
  j["initializer_range"] = c.initializer_range;
  j["intermediate_size"] = c.intermediate_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["mlp_bias"] = c.mlp_bias;
  j["model_type"] = c.model_type;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["pad_token_id"] = c.pad_token_id ? json(*c.pad_token_id) : json(nullptr);
  j["pretraining_tp"] = 1;
  j["rms_norm_eps"] = c.rms_norm_eps;
  json rope = {{"rope_theta", c.rope_theta}, {"rope_type", c.rope_scaling.type}};
  const RopeScaling& r = c.rope_scaling;
  if (r.type != "default") rope["factor"] = r.factor;
  if (r.type == "llama3") {
    rope["low_freq_factor"] = r.low_freq_factor;
    rope["high_freq_factor"] = r.high_freq_factor;
    rope["original_max_position_embeddings"] = r.original_max_position_embeddings;
  }
  j["rope_parameters"] = rope;
  // transformers takes rope_scaling first (the same object); mlx_lm reads only rope_scaling.
  if (r.type != "default") j["rope_scaling"] = rope;
  j["rope_theta"] = c.rope_theta;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["use_cache"] = true;
  j["vocab_size"] = c.vocab_size;
  if (c.model_type == "mistral") j["sliding_window"] = nullptr;
  if (c.model_type == "qwen2") {
    j["sliding_window"] = nullptr;
    j["use_sliding_window"] = false;
    j["max_window_layers"] = c.num_hidden_layers;
    j["layer_types"] = std::vector<std::string>(c.num_hidden_layers, "full_attention");
  }
  return j.dump(2) + "\n";
}

std::string to_generation_json(const Config& c) {
  json j;
  j["_from_model_config"] = true;
  j["bos_token_id"] = c.bos_token_id ? json(*c.bos_token_id) : json(nullptr);
  j["eos_token_id"] = c.eos_token_ids.empty()       ? json(nullptr)
                      : c.eos_token_ids.size() == 1 ? json(c.eos_token_ids[0])
                                                    : json(c.eos_token_ids);
  if (c.pad_token_id) j["pad_token_id"] = *c.pad_token_id;
  return j.dump(2) + "\n";
}

std::optional<Config> preset_config(const std::string& name) {
  Config c;
  c.dtype = "bfloat16";
  c.rms_norm_eps = 1e-5;
  if (name == "llama2-7b") {  // meta-llama/Llama-2-7b-hf
    c.max_position_embeddings = 4096;
    c.dtype = "float16";
    return c;
  }
  // meta-llama/Meta-Llama-3-{8B,70B}, Llama-3.1-8B and Llama-3.2-1B: the Llama 3 vocabulary
  // and attention; the later ones scale the rotary embedding (llama3) for 131072 tokens.
  const bool llama31 = name == "llama3.1-8b", llama32 = name == "llama3.2-1b";
  if (name == "llama3-8b" || name == "llama3-70b" || llama31 || llama32) {
    c.vocab_size = 128256;
    c.num_key_value_heads = 8;
    c.max_position_embeddings = 8192;
    c.rope_theta = 500000.0;
    c.bos_token_id = 128000;
    c.eos_token_ids = {128001};  // the base models' (the Instruct ones list 128008, 128009 too)
    if (llama31 || llama32) {
      c.max_position_embeddings = 131072;
      c.rope_scaling = {"llama3", llama31 ? 8.0 : 32.0, 1.0, 4.0, 8192};
    }
    if (name == "llama3-70b") {
      c.hidden_size = 8192;
      c.intermediate_size = 28672;
      c.num_hidden_layers = 80;
      c.num_attention_heads = 64;
    } else if (llama32) {
      c.hidden_size = 2048;
      c.intermediate_size = 8192;
      c.num_hidden_layers = 16;
      c.head_dim = 64;
      c.tie_word_embeddings = true;
    } else {  // the 8B models
      c.intermediate_size = 14336;
    }
    return c;
  }
  return std::nullopt;
}

std::vector<std::string> preset_names() {
  return {"llama2-7b", "llama3-8b", "llama3-70b", "llama3.1-8b", "llama3.2-1b"};
}

}  // namespace fsdp::models::llama
