//! Demangling (the `rustc-demangle` and `cpp_demangle` crates) and the
//! bound on the length of every name the symbolizer hands out.

/// The longest name or path kept (bytes): a hostile file's 1 MB symbol
/// name is cut here, with a `...` mark.
pub const MAX_NAME: usize = 4096;

/// `name` cut to [`MAX_NAME`] bytes at a character boundary, with `...`
/// appended when cut.
pub fn bounded(name: &str) -> String {
    if name.len() <= MAX_NAME {
        return name.to_string();
    }
    let mut end = MAX_NAME - 3;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &name[..end])
}

/// The demangled form of a symbol name, bounded; the name itself (bounded)
/// when it is not mangled or does not demangle. `language` (from DWARF)
/// picks the scheme; without it Rust's is tried first (its legacy names
/// end in a `17h<hash>E` that C++ would print as a namespace), then C++'s.
pub fn demangle(name: &str, language: Option<gimli::DwLang>) -> String {
    // A name too long to keep is not worth demangling (and cut, it would
    // not demangle anyway).
    if name.len() > MAX_NAME {
        return bounded(name);
    }
    let demangled = match language {
        Some(gimli::DW_LANG_Rust) => rust(name),
        Some(
            gimli::DW_LANG_C_plus_plus
            | gimli::DW_LANG_C_plus_plus_03
            | gimli::DW_LANG_C_plus_plus_11
            | gimli::DW_LANG_C_plus_plus_14
            | gimli::DW_LANG_C_plus_plus_17
            | gimli::DW_LANG_C_plus_plus_20,
        ) => cpp(name),
        _ => rust(name).or_else(|| cpp(name)),
    };
    match demangled {
        Some(d) => bounded(&d),
        None => bounded(name),
    }
}

fn rust(name: &str) -> Option<String> {
    let d = rustc_demangle::try_demangle(name).ok()?;
    // `{:#}` leaves out the legacy hash suffix.
    Some(format!("{d:#}"))
}

fn cpp(name: &str) -> Option<String> {
    if !name.starts_with("_Z") {
        return None;
    }
    let symbol = cpp_demangle::Symbol::new(name).ok()?;
    symbol
        .demangle_with_options(&cpp_demangle::DemangleOptions::default())
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_legacy_and_v0_names_demangle() {
        assert_eq!(
            demangle("_ZN4core3fmt9Formatter3pad17h0123456789abcdefE", None),
            "core::fmt::Formatter::pad"
        );
        assert_eq!(
            demangle(
                "_ZN4core3fmt9Formatter3pad17h0123456789abcdefE",
                Some(gimli::DW_LANG_Rust)
            ),
            "core::fmt::Formatter::pad"
        );
        // v0 mangling (RFC 2603): `_RNvCs..._5mycrate3foo`.
        assert_eq!(demangle("_RNvCs1234_7mycrate3foo", None), "mycrate::foo");
    }

    #[test]
    fn cpp_names_demangle() {
        assert_eq!(
            demangle("_ZN2ns5Klass6methodEi", None),
            "ns::Klass::method(int)"
        );
        assert_eq!(
            demangle("_ZN2ns5Klass6methodEi", Some(gimli::DW_LANG_C_plus_plus_11)),
            "ns::Klass::method(int)"
        );
    }

    #[test]
    fn plain_and_broken_names_stay() {
        assert_eq!(demangle("main", None), "main");
        assert_eq!(demangle("_Z", None), "_Z");
        assert_eq!(
            demangle("_ZN3foo", Some(gimli::DW_LANG_C_plus_plus)),
            "_ZN3foo"
        );
        assert_eq!(demangle("_R", None), "_R");
    }

    #[test]
    fn huge_names_are_cut() {
        let huge = "x".repeat(1 << 20);
        let d = demangle(&huge, None);
        assert_eq!(d.len(), MAX_NAME);
        assert!(d.ends_with("..."));
        // At a character boundary.
        let wide = "é".repeat(5000);
        let d = bounded(&wide);
        assert!(d.len() <= MAX_NAME && d.ends_with("..."));
        let mangled = format!("_ZN{}{}E", 100_000, "a".repeat(100_000));
        assert!(demangle(&mangled, None).len() <= MAX_NAME);
    }
}
