"""`sd2 bench`: methods × prompt sets × temperatures × k, side by side with the peers and the ceilings.

Modules, one concept each:
    plan       what to run (frozen dataclasses: methods, cells, lengths, repetitions)
    prompts    the prompt sets (assets/prompts/*.jsonl, else a labelled built-in demo set)
    measure    one timed generation of ours (via Engine) → GenerationStats
    hf         one timed generation of transformers `generate` (plain or assisted) → GenerationStats
    forward    isolated forward times T_v(1), T_v(k+1), T_d(1) for the machine's ceiling S_fwd
    aggregate  per method × prompt set × temperature × k: medians, spreads, τ, speed-ups, ceilings
    gain       the steering gain per cell (--counterfactual): pooled over blocks, interval over prompts
    harness    the run loop (warm-up, interleaved repetitions) → BenchReport
    report     the versioned JSON schema and the output files
    table      the Markdown tables (the paper's Table 1 layout + details)
    figure     the Plotly HTML figure
    command    the `sd2 bench` arguments and entry point

Importing this package loads nothing heavy; torch and transformers are imported by the modules that
need them.
"""
