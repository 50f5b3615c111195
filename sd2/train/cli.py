"""`sd2 train pretrain|distill|sd2|export` and `sd2 import-official`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sd2.choices import LOSSES
from sd2.cli_args import add_placement_arguments
from sd2.train.config import PRECISIONS


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    train = sub.add_parser("train", help="train drafters: pretrain, distill, sd2")
    objectives = train.add_subparsers(dest="objective", required=True)
    pretrain = objectives.add_parser("pretrain", help="a new small drafter, next-token loss on text")
    pretrain.add_argument("--layers", type=int, default=4)
    pretrain.add_argument("--hidden", type=int, default=256)
    pretrain.add_argument("--ffn", type=int, default=1024)
    pretrain.add_argument(
        "--data",
        default="pydocs,sharegpt-turns",
        help="comma-separated: pydocs, sharegpt (first replies), sharegpt-turns (every reply), synth:PATH",
    )
    pretrain.add_argument(
        "--from",
        dest="base",
        default=None,
        help="continue pretraining this drafter checkpoint (a new schedule; --layers/--hidden/--ffn ignored)",
    )
    distill = objectives.add_parser("distill", help="forward KL(verifier ‖ drafter) on responses")
    sd2 = objectives.add_parser("sd2", help="distill with the SD² steering head trained jointly")
    sd2.add_argument("--freeze-drafter", action="store_true", help="ablation: train only the steering head")
    lockstep = objectives.add_parser(
        "lockstep",
        help="several fine-tunes of one base on the same batches, one verifier forward per batch for all",
        description="Runs each --run fine-tune exactly as `sd2 train distill|sd2` would (same checkpoints, "
        "same results), taking their steps in turn so that one verifier forward per batch serves them all. "
        "Re-running resumes every run from its own checkpoint.",
    )
    lockstep.add_argument(
        "--run",
        dest="runs",
        action="append",
        required=True,
        type=_lockstep_run,
        metavar="RECIPE=OUT",
        help="a fine-tune and its checkpoint folder; RECIPE is distill, sd2 or sd2-frozen (repeat the flag)",
    )
    for parser in (distill, sd2):
        parser.add_argument("--from", dest="base", required=True, help="the drafter checkpoint to start from")
    for parser in (distill, sd2, lockstep):
        parser.add_argument(
            "--freeze-embeddings",
            action="store_true",
            help="keep the drafter's token embeddings and LM head as they start (a cut drafter's are the "
            "verifier's: `sd2 train export --embeddings-from-verifier` then stores no copy of them)",
        )
        parser.add_argument(
            "--loss",
            choices=LOSSES,
            default="kl",
            help="the divergence of the drafter from the verifier at T = 1: forward KL (default), tvd = TV "
            "distance (1 − the acceptance probability: what the decoding rule pays), mixed = their mean",
        )
    lockstep.add_argument(
        "--from",
        dest="bases",
        action="append",
        required=True,
        type=_lockstep_base,
        metavar="[RECIPE=]PATH",
        help="the drafter checkpoint every run starts from; RECIPE=PATH (repeatable) starts that recipe's "
        "run from its own checkpoint instead — e.g. each shipped fine-tune, to continue all of them equally",
    )
    for parser in (distill, sd2, lockstep):
        parser.add_argument(
            "--data", default="sharegpt", help="comma-separated: sharegpt, sharegpt-turns, synth:PATH, pydocs"
        )
    for parser in (pretrain, distill, sd2):
        parser.add_argument("--out", required=True, help="checkpoint folder (re-running resumes it)")
        _common(parser)
        parser.set_defaults(func=_train)
    _common(lockstep)
    lockstep.set_defaults(func=_train_lockstep)
    export = objectives.add_parser("export", help="a shippable bf16 copy of a checkpoint (no trainer state)")
    export.add_argument("source")
    export.add_argument("--out", required=True)
    export.add_argument(
        "--share-drafter-with",
        metavar="FOLDER",
        default=None,
        help="for a --freeze-drafter run: store only the steering head and take the (identical) drafter "
        "weights from this exported checkpoint",
    )
    export.add_argument(
        "--embeddings-from-verifier",
        action="store_true",
        help="for a --freeze-embeddings run of a drafter cut from the verifier: store no copy of its token "
        "embeddings and LM head (loading takes them from the verifier, checked by SHA-256)",
    )
    export.add_argument(
        "--verifier",
        default=None,
        help="the verifier a drafter borrows its embeddings from (default: the embedded SmolLM2)",
    )
    export.set_defaults(func=_export)
    grow = objectives.add_parser(
        "grow",
        help="a deeper copy of a drafter checkpoint that computes the same logits (then train it)",
        description="Inserts a copy of each --after layer right behind it, with its attention and MLP "
        "output projections zeroed (block expansion): the new layers add 0 until training moves them. A "
        "steering head grows with the drafter, from zero rows. The result is a checkpoint for "
        "`sd2 train distill|sd2|lockstep --from`.",
    )
    grow.add_argument("source", help="the drafter checkpoint to deepen")
    grow.add_argument("--out", required=True)
    grow.add_argument(
        "--after",
        required=True,
        type=_layer_list,
        metavar="I,J,...",
        help="the layers to copy (0-based, repeat an index for several copies), e.g. 1,3",
    )
    grow.set_defaults(func=_grow)
    prune = objectives.add_parser(
        "prune",
        help="a drafter cut from the verifier: its most important layers, optionally narrower MLPs",
        description="Keeps the verifier's --layers most important decoder layers (block importance: the "
        "angular distance between a layer's input and output on calibration text) or the --keep list, and "
        "with --ffn the top MLP channels of each (activation importance), with the verifier's embeddings, "
        "norm and LM head. The result is a checkpoint for `sd2 train distill|sd2|lockstep --from`.",
    )
    prune.add_argument("--out", required=True)
    prune.add_argument("--verifier", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    depth = prune.add_mutually_exclusive_group(required=True)
    depth.add_argument("--layers", type=int, help="how many layers to keep, the most important ones")
    depth.add_argument("--keep", type=_layer_list, metavar="I,J,...", help="the layers to keep (0-based)")
    prune.add_argument("--ffn", type=int, default=None, help="MLP channels to keep per layer (default: all)")
    prune.add_argument(
        "--calibration",
        default="pydocs",
        help="calibration text: a --data source (its train split) or text:PATH (default pydocs)",
    )
    prune.add_argument("--calibration-rows", type=int, default=64, help="rows of calibration text (64)")
    prune.add_argument("--calibration-tokens", type=int, default=512, help="tokens per row at most (512)")
    prune.add_argument(
        "--draft-vocab-from",
        default=None,
        metavar="FOLDER",
        help="copy this drafter folder's reduced draft vocabulary, e.g. assets/drafters/sd2",
    )
    prune.set_defaults(func=_prune)
    imp = sub.add_parser(
        "import-official", help="convert an ETH-DISCO/SD-square checkpoint into a drafter folder"
    )
    imp.add_argument("path", help="folder with the official config.json + pytorch_model.bin")
    imp.add_argument("--out", required=True)
    imp.add_argument("--drafter-config", default=None, help="hub id or folder of the base drafter's config")
    imp.set_defaults(func=_import_official)


def _lockstep_run(text: str) -> tuple[str, str]:
    from sd2.train.run import LOCKSTEP_RECIPES

    recipe, sep, out = text.partition("=")
    if not sep or not out or recipe not in LOCKSTEP_RECIPES:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not RECIPE=OUT with RECIPE one of {', '.join(LOCKSTEP_RECIPES)}"
        )
    return recipe, out


def _lockstep_base(text: str) -> tuple[str | None, str]:
    """`PATH` (every run's base) or `RECIPE=PATH` (that recipe's run only) → (recipe or None, PATH)."""
    from sd2.train.run import LOCKSTEP_RECIPES

    recipe, sep, path = text.partition("=")
    if sep and recipe in LOCKSTEP_RECIPES:
        if not path:
            raise argparse.ArgumentTypeError(f"{text!r} names no checkpoint after {recipe}=")
        return recipe, path
    return None, text


def _layer_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of layer indices") from None


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verifier", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--warmup-steps", type=int, default=50)
    parser.add_argument("--k", type=int, default=8, help="δ range for sd2 and the k used to measure τ")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--eval-every", type=int, default=200)
    parser.add_argument("--save-every", type=int, default=200)
    parser.add_argument("--eval-prompts", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--skip-batches",
        type=int,
        default=0,
        metavar="N",
        help="start at batch N of the first epoch's order: with the same --seed and data, continue where "
        "an earlier run of N steps (× grad-accum) stopped, on rows it never saw",
    )
    parser.add_argument(
        "--validation-data",
        default="sharegpt",
        help="validation rows and τ prompts: sharegpt (recorded replies of held-out prompts) or synth:PATH "
        "made by `sd2 data synth --split validation` (the verifier's own answers to them)",
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads (1 is fastest on a busy box)"
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="auto",
        help="autocast dtype of the forwards (fp32 master weights and losses either way); auto = bf16 on a "
        "CUDA GPU, fp32 on CPU; bf16 is ≈ 2× faster on CPUs with AVX-512 BF16 or AMX",
    )
    add_placement_arguments(parser, device=False)  # --dtype: the frozen verifier's weights


def _train(args: argparse.Namespace) -> int:
    from sd2.train.run import run_training

    run_training(args)
    return 0


def _train_lockstep(args: argparse.Namespace) -> int:
    from sd2.train.run import run_lockstep

    run_lockstep(args)
    return 0


def _grow(args: argparse.Namespace) -> int:
    from sd2.train.grow import grow_checkpoint

    print(grow_checkpoint(Path(args.source), Path(args.out), args.after))
    return 0


def _cpu_verifier(name_or_path: str | None):
    """The verifier (default: the embedded one) in fp32 on the CPU, for commands that read its weights."""
    from sd2.devices import default_placement
    from sd2.models import load_causal_lm, resolve_model_path

    return load_causal_lm(resolve_model_path(name_or_path), default_placement("cpu", "fp32"))


def _prune(args: argparse.Namespace) -> int:
    from sd2.models import drafter_vocab, load_tokenizer, resolve_model_path, verifier_label
    from sd2.train.prune import calibration_rows, prune_checkpoint

    verifier = _cpu_verifier(args.verifier)
    tokenizer = load_tokenizer(resolve_model_path(args.verifier))
    rows = calibration_rows(args.calibration, tokenizer, args.calibration_rows, args.calibration_tokens)
    vocab = drafter_vocab(args.draft_vocab_from) if args.draft_vocab_from else None
    if args.draft_vocab_from and vocab is None:
        print(f"sd2 train prune: {args.draft_vocab_from} has no draft_vocab.json", file=sys.stderr)
        return 2
    out = prune_checkpoint(
        verifier,
        verifier_label(args.verifier),
        tokenizer,
        Path(args.out),
        rows,
        args.calibration,
        layers=args.layers,
        keep=args.keep,
        ffn=args.ffn,
        draft_vocab=vocab,
    )
    print(out)
    return 0


def _import_official(args: argparse.Namespace) -> int:
    from sd2.official import convert_official

    print(convert_official(Path(args.path), Path(args.out), args.drafter_config))
    return 0


def _export(args: argparse.Namespace) -> int:
    from sd2.models import drafter_card, verifier_label
    from sd2.train.checkpoint import export_checkpoint
    from sd2.verifier_embeddings import borrows_embeddings

    share = Path(args.share_drafter_with) if args.share_drafter_with else None
    needs_verifier = args.embeddings_from_verifier or borrows_embeddings(drafter_card(args.source))
    verifier = _cpu_verifier(args.verifier) if needs_verifier else None
    out = export_checkpoint(
        Path(args.source),
        Path(args.out),
        share_drafter_with=share,
        verifier=verifier,
        verifier_name=verifier_label(args.verifier),
        borrow_embeddings=args.embeddings_from_verifier,
    )
    print(out)
    return 0
