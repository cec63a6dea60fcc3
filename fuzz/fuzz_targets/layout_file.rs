//! Fuzzes the layout file parser and validator (R6, R7): any text gives a layout or one
//! typed error, never a panic; a layout that validates has a nonzero page size for every
//! group and a fingerprint, and keeps validating at every world size that divides its heads.
#![no_main]

use kv_connector::core::layout::Layout;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Layout::from_toml_str(text, "fuzz.toml") {
        Ok(layout) => {
            for group in &layout.groups {
                let bytes = layout.page_bytes(group).expect("a valid layout has page sizes");
                assert!(bytes > 0, "R7: a valid layout has no zero page size");
            }
            let _ = layout.fingerprint();
            for world in [1, 2, 3, 8] {
                if let Ok(wider) = layout.with_world_size(world) {
                    for group in &wider.groups {
                        assert!(wider.page_bytes(group).is_ok_and(|bytes| bytes > 0));
                    }
                }
            }
        }
        Err(err) => {
            let _ = (err.to_string(), err.kind());
        }
    }
});
