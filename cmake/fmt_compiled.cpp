// fmt's compiled functions, once per library and program (fsdp_fmt, cmake/FsdpDependencies.cmake).
//
// libtorch ships fmt's headers (12.1 in torch 2.11) but no fmt library. Used header-only, fmt
// put its whole implementation (format-inl.h: the float formatting, vformat) into every source
// that formats: about 3 s of compilation each, for some 60 translation units of this build.
// Here it is compiled once; the other sources include fmt's declarations only.
//
// What follows instantiates the templates that fmt/format.h declares and defines only in
// format-inl.h (fmt's own src/format.cc does the same for its library). A missing one is an
// undefined symbol at link time, never a silent difference.
#include <fmt/format-inl.h>

FMT_BEGIN_NAMESPACE
namespace detail {
template auto dragonbox::to_decimal(float x) noexcept -> dragonbox::decimal_fp<float>;
template auto dragonbox::to_decimal(double x) noexcept -> dragonbox::decimal_fp<double>;
template auto thousands_sep_impl(locale_ref) -> thousands_sep_result<char>;
template auto thousands_sep_impl(locale_ref) -> thousands_sep_result<wchar_t>;
template auto decimal_point_impl(locale_ref) -> char;
template auto decimal_point_impl(locale_ref) -> wchar_t;
}  // namespace detail
#if FMT_USE_LOCALE
template auto locale_ref::get<std::locale>() const -> std::locale;
#endif
FMT_END_NAMESPACE
