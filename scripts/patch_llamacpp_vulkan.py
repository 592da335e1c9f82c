#!/usr/bin/env python3
"""Lets llama.cpp's Vulkan backend (as vendored by llama-cpp-python 0.3.36) build against Debian
12's Vulkan headers (1.3.239): its instance creation passes validation-layer settings through
VK_EXT_layer_settings, an extension those headers do not declare. Where the headers lack it
(#ifndef VK_EXT_layer_settings) the instance is created without them: only the validation
layer's best-practice checks (GGML_VK_VALIDATE, a debugging aid) are lost; the compute path is
untouched. Idempotent; exits 1 when the code to patch is not found (another llama.cpp).

    scripts/patch_llamacpp_vulkan.py SOURCE_DIR    (the extracted llama_cpp_python-X.Y.Z/)
"""
import os
import sys

OLD = """    VkBool32 enable_best_practice = layer_settings;
    std::vector<vk::LayerSettingEXT> settings = {"""
END = """    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions, &layer_setting_info);
"""
MARK = "// fsdp-cpp: Debian 12's Vulkan headers lack VK_EXT_layer_settings"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    path = os.path.join(sys.argv[1], "vendor/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp")
    if not os.path.isfile(path):
        sys.exit(f"patch_llamacpp_vulkan: no {path}")
    text = open(path).read()
    if MARK in text:
        return
    start, end = text.find(OLD), text.find(END)
    if start < 0 or end < start:
        sys.exit(f"patch_llamacpp_vulkan: {path} has no layer-settings block to patch")
    end += len(END)
    block = text[start:end]
    patched = (f"{MARK}\n#ifdef VK_EXT_layer_settings\n{block}#else\n"
               "    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, "
               "layers, extensions);\n#endif\n")
    open(path, "w").write(text[:start] + patched + text[end:])
    print(f"patched {path} (no VK_EXT_layer_settings in these headers)")


if __name__ == "__main__":
    main()
