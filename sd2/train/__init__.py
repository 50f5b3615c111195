"""Training the drafters: `pretrain` (next-token), `distill` (forward KL to the verifier) and `sd2`
(the same KL with the steering head trained jointly), on accelerate (CPU, one GPU or many)."""
