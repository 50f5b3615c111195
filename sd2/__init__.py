"""sd2: a lab for steered speculative decoding (SD², Berdoz, Rheinboldt & Wattenhofer, AAAI 2026).

Dims glossary used in shape comments across the package:
    B batch, T sequence, K draft length (k), V vocab, D hidden, F MLP inner size, L layers.

Importing the package loads nothing heavy and touches no web/DB framework (docs/architecture.md#import-rules).
"""

__version__ = "0.1.0"
