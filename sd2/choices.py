"""The named choices the engine resolves and the command line offers (torch-free, so the CLI can
build its flags without importing the engine, and the engine's modules import no CLI module)."""

from collections.abc import Mapping

DTYPE_CHOICES = ("auto", "bf16", "fp32")  # resolved by sd2.devices.default_placement
DTYPE_ENV = "SD2_DTYPE"
DRAFT_STEP_CHOICES = ("auto", "eager", "direct", "compiled")  # resolved by sd2.draft_step.resolve_draft_step
DRAFT_STEP_ENV = "SD2_DRAFT_STEP"
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")  # a boolean variable's
DRAFT_WEIGHTS_CHOICES = ("auto", "int8", "full")  # resolved by sd2.int8_weights.resolve_draft_weights
DRAFT_WEIGHTS_ENV = "SD2_DRAFT_WEIGHTS"
PACKED_WEIGHTS_ENV = "SD2_PACKED_WEIGHTS"  # 0/false/off: no packed copy of the weights (sd2.invariant)
LOSSES = ("kl", "tvd", "mixed")  # the fine-tuning divergences of sd2.losses.draft_loss


def env_flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    """A boolean variable: 1/true/yes/on or 0/false/no/off (any case); unset or empty → default. Raises
    ValueError naming the variable and its value otherwise."""
    value = env.get(name, "").strip().lower()
    if not value:
        return default
    if value not in TRUE_WORDS + FALSE_WORDS:
        raise ValueError(
            f"{name} must be one of {'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)}, got {env[name]!r}"
        )
    return value in TRUE_WORDS
