"""Real-model harness for the `kv_connector` tests.

Tiny, seeded transformers models (GPT-OSS, Gemma 3, Llama styles) are served by
`engine.Instance`, a small paged-KV serving instance that drives a connector through its
hooks, and compared with `engine.native_run`, transformers computing the same tokens with
its own cache and no reuse. `scenarios` holds the workloads, each an instance A part and
an instance B part; `peer` runs the A parts in a process of its own (the Mooncake tests).
`drafter` adds an EAGLE-style draft head whose KV is the layout's draft group, and an
instance that drafts and verifies with it; `draft_scenarios` compares what it drafts
after a load with local prefix reuse. `fake_connector` is a pure-Python stand-in for the package, used only by the harness
self-tests.
"""
