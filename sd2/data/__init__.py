"""Training and evaluation data for the drafters: offline corpora, seeded splits, prompt sets,
verifier-generated (synthetic) responses and tokenised shards.

Modules: `records` (Conversation, Provenance), `sharegpt`, `pydocs`, `humaneval` (corpus readers),
`split` (seeded split by conversation), `prompt_sets` (held-out evaluation prompts), `synth`
(the verifier answers prompts), `examples` + `shards` (tokenised, cached on disk), `datasets`
(ready-made shard folders for training), `batches` (seeded shuffled batches), `atomic` (atomic
writes), `cli` (`sd2 data ...`). Importing this package does no work.
"""
