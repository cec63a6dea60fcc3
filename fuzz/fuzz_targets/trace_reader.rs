//! Fuzzes the Mooncake trace reader: any bytes give requests or one typed error naming
//! the line, never a panic; every request it yields satisfies rules `trace::V2`-V4.
#![no_main]

use std::io::Cursor;

use kv_connector::replay::workload::{PromptSource, TraceReader};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut previous = 0;
    for request in TraceReader::new(Cursor::new(data), "fuzz.jsonl") {
        match request {
            Ok(request) => {
                assert!(request.arrival_ms >= previous, "trace::V2: timestamps never go back");
                previous = request.arrival_ms;
                let PromptSource::MooncakeBlocks { hash_ids, prompt_len } = &request.prompt
                else {
                    panic!("a trace request is made of mooncake blocks");
                };
                let prompt_len = usize::try_from(*prompt_len).expect("u32 fits usize");
                assert!(prompt_len > 0 && !hash_ids.is_empty(), "trace::V3/V4");
                assert!((hash_ids.len() - 1) * 512 < prompt_len, "trace::V4 lower bound");
                assert!(prompt_len <= hash_ids.len() * 512, "trace::V4 upper bound");
            }
            Err(err) => {
                let message = err.to_string();
                assert!(message.contains("fuzz.jsonl"), "errors name the file: {message}");
                let _ = err.kind();
            }
        }
    }
});
