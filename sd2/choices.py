"""The named choices the engine resolves and the command line offers (torch-free, so the CLI can
build its flags without importing the engine, and the engine's modules import no CLI module)."""

DTYPE_CHOICES = ("auto", "bf16", "fp32")  # resolved by sd2.devices.default_placement
DTYPE_ENV = "SD2_DTYPE"
DRAFT_STEP_CHOICES = ("auto", "eager", "compiled")  # resolved by sd2.draft_step.resolve_draft_step
DRAFT_STEP_ENV = "SD2_DRAFT_STEP"
LOSSES = ("kl", "tvd", "mixed")  # the fine-tuning divergences of sd2.losses.draft_loss
