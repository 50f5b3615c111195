"""The facade: methods, chat prompts, bad input named clearly, mismatched tokenizers refused."""

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sd2.cli import main
from sd2.config import DecodeConfig
from sd2.engine import Engine, GenerateRequest, UnknownDrafterError, UnknownMethodError
from sd2.errors import InvalidValue
from sd2.models import TokenizerMismatchError
from sd2.steering import new_head_for
from tests.tiny import tiny_llama, tiny_tokenizer


@pytest.fixture(scope="module")
def engine(tiny_pair_dir):
    verifier_dir, drafter_dir = tiny_pair_dir
    return Engine.load(verifier=str(verifier_dir), drafters={"tiny": str(drafter_dir)})


@pytest.fixture(scope="module")
def steered_drafter_dir(tiny_pair_dir, tmp_path_factory):
    """The tiny drafter plus a non-zero SD² head, saved as a drafter checkpoint folder."""
    verifier_dir, drafter_dir = tiny_pair_dir
    folder = tmp_path_factory.mktemp("steered")
    drafter = LlamaForCausalLM.from_pretrained(drafter_dir)
    drafter.save_pretrained(folder)
    head = new_head_for(LlamaForCausalLM.from_pretrained(verifier_dir), drafter)
    with torch.no_grad():
        head.w_s.normal_(0, 0.3)
    head.save(folder)
    return folder


def test_every_method_matches_verifier_greedy(engine):
    decode = DecodeConfig(k=3, max_new_tokens=24)
    reference = engine.generate(GenerateRequest(prompt="Tell me a story.", decode=decode))
    assert reference.metrics.tau == 1.0
    for method in ("self", "tiny"):
        result = engine.generate(GenerateRequest(prompt="Tell me a story.", method=method, decode=decode))
        assert result.token_ids == reference.token_ids
        assert result.text == reference.text
    assert (
        engine.generate(GenerateRequest(prompt="Tell me a story.", method="self", decode=decode)).metrics.tau
        == 4
    )


def test_steered_drafter_loads_with_its_head_and_can_run_unsteered(tiny_pair_dir, steered_drafter_dir):
    verifier_dir, _ = tiny_pair_dir
    engine = Engine.load(verifier=str(verifier_dir), drafters={"sd2": str(steered_drafter_dir)})
    assert engine.drafters["sd2"].head is not None
    decode = DecodeConfig(k=4, max_new_tokens=20)
    on = engine.generate(GenerateRequest(prompt="Hello!", method="sd2", decode=decode))
    off = engine.generate(GenerateRequest(prompt="Hello!", method="sd2", decode=decode, steering=False))
    assert on.steering and not off.steering
    assert on.token_ids == off.token_ids
    assert on.blocks[1].steering_norm is not None and off.blocks[1].steering_norm is None


def test_stream_yields_blocks_with_text_then_the_result(engine):
    items = list(
        engine.stream(
            GenerateRequest(prompt="Hello!", method="tiny", decode=DecodeConfig(k=2, max_new_tokens=10))
        )
    )
    *blocks, result = items
    assert blocks == result.blocks
    assert "".join(t.text for b in blocks for t in b.emitted) == engine.tokenizer.decode(result.token_ids)
    payload = json.loads(json.dumps(result.to_dict()))
    assert payload["blocks"][1]["drafts"][0]["status"] in {"accepted", "rejected"}
    assert set(payload["metrics"]) >= {"tau", "acceptance_rate", "alpha_hat", "tokens_per_s", "n_blocks"}


def test_chat_messages_use_the_verifiers_template(engine):
    messages = (
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Bye"},
    )
    ids = engine.encode(GenerateRequest(messages=messages))
    text = engine.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>user\nHi<|im_end|>") and text.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("request_kwargs", "field"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": "   "}, "prompt"),
        ({"prompt": "hi", "method": "nope"}, "method"),
        ({"prompt": "x " * 600}, "prompt is too long"),
        ({"messages": ({"role": "robot", "content": "x"},)}, "messages[0].role"),
        ({"messages": ({"role": "user", "content": ""},)}, "messages[0].content"),
    ],
)
def test_bad_requests_name_what_was_wrong(engine, request_kwargs, field):
    with pytest.raises(ValueError) as err:
        engine.generate(GenerateRequest(**request_kwargs))
    assert field in str(err.value)


def test_unknown_method_lists_the_available_ones(engine):
    with pytest.raises(UnknownMethodError, match="available: verifier, self, tiny"):
        engine.generate(GenerateRequest(prompt="hi", method="sd3"))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"k": 0}, "k"),
        ({"k": "8"}, "k"),  # only the word auto is a string k
        ({"k": True}, "k"),
        ({"draft_threshold": -0.1}, "draft_threshold"),
        ({"draft_threshold": 1.5}, "draft_threshold"),
        ({"draft_threshold": float("nan")}, "draft_threshold"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": 1e-9}, "temperature"),  # would overflow logits / T into NaN
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"top_k": -1}, "top_k"),
    ],
)
def test_decode_config_names_the_bad_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field} "):
        DecodeConfig(**kwargs)


def test_mismatched_tokenizers_are_refused(tiny_pair_dir, tmp_path):
    verifier_dir, _ = tiny_pair_dir
    other_vocab = tmp_path / "other_vocab"
    tiny_llama(vocab_size=300).save_pretrained(other_vocab)
    with pytest.raises(TokenizerMismatchError, match="vocab_size 300"):
        Engine.load(verifier=str(verifier_dir), drafters={"bad": str(other_vocab)})
    other_ids = tmp_path / "other_ids"
    tiny_llama().save_pretrained(other_ids)
    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens(["<|completely_new|>"])  # a different vocabulary of the same size on disk
    tokenizer.save_pretrained(other_ids)
    with pytest.raises(TokenizerMismatchError, match="tokenizer differs"):
        Engine.load(verifier=str(verifier_dir), drafters={"bad": str(other_ids)})


def test_unsupported_architecture_is_refused(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    from sd2.architecture import UnsupportedArchitectureError, decoder_layers

    with pytest.raises(UnsupportedArchitectureError, match="'gpt2' is not supported"):
        decoder_layers(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)))
    assert (
        len(
            decoder_layers(
                LlamaForCausalLM(
                    LlamaConfig(
                        vocab_size=64,
                        hidden_size=32,
                        intermediate_size=64,
                        num_hidden_layers=2,
                        num_attention_heads=2,
                    )
                )
            )
        )
        == 2
    )


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "mistral"])
def test_other_supported_families_steer_and_stay_lossless(family):
    from transformers import AutoConfig, AutoModelForCausalLM

    from sd2.decoding import SpeculativeDecoder, verifier_decode
    from sd2.proposer import Proposer

    def build(seed, layers):
        torch.manual_seed(seed)
        config = AutoConfig.for_model(
            family,
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            tie_word_embeddings=False,
        )
        return AutoModelForCausalLM.from_config(config).eval()

    verifier, drafter = build(0, 3), build(1, 2)
    head = new_head_for(verifier, drafter)
    with torch.no_grad():
        head.w_s.normal_(0, 0.5)
    config = DecodeConfig(k=3, max_new_tokens=16)
    expected = [
        t.token_id for b in verifier_decode(verifier, [1, 2, 3], config, frozenset()) for t in b.emitted
    ]
    blocks = SpeculativeDecoder(verifier, Proposer(drafter, head), config, frozenset()).run([1, 2, 3])
    assert [t.token_id for b in blocks for t in b.emitted] == expected


def test_cli_json_prints_exactly_one_object(tiny_pair_dir, capsys):
    verifier_dir, drafter_dir = tiny_pair_dir
    code = main(
        [
            "generate",
            "--verifier",
            str(verifier_dir),
            "--drafter",
            f"tiny={drafter_dir}",
            "--method",
            "tiny",
            "--k",
            "3",
            "--max-new-tokens",
            "12",
            "--json",
            "--prompt",
            "Hello",
        ]
    )
    assert code == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["method"] == "tiny" and len(payload["token_ids"]) == 12
    assert payload["metrics"]["n_tokens"] == 12


def test_cli_reports_bad_input_with_exit_code_2(tiny_pair_dir, capsys):
    verifier_dir, _ = tiny_pair_dir
    assert main(["generate", "--verifier", str(verifier_dir), "--k", "0", "--json"]) == 2
    assert "k must be" in capsys.readouterr().err


def test_cli_colours_tokens_by_status(tiny_pair_dir, capsys):
    from sd2.console import render_blocks

    verifier_dir, drafter_dir = tiny_pair_dir
    engine = Engine.load(verifier=str(verifier_dir), drafters={"tiny": str(drafter_dir)})
    result = engine.generate(
        GenerateRequest(prompt="Hello", method="tiny", decode=DecodeConfig(k=4, max_new_tokens=20))
    )
    coloured = render_blocks(result.blocks, colour=True)
    assert "\033[34m" in coloured  # resampled/bonus in blue
    assert ("\033[31;9m" in coloured) == any(t.status == "rejected" for b in result.blocks for t in b.drafts)
    assert render_blocks(result.blocks, colour=False, show_drafts=False) == "".join(
        t.text for b in result.blocks for t in b.emitted
    )


def test_shipped_drafters_are_found_complete_only_and_best_first(tmp_path):
    from sd2.shipped import shipped_drafters

    for name in ("pretrained", "sd2", "custom", "partial"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
        if name != "partial":
            (tmp_path / name / "sd2_card.json").write_text("{}")
    assert list(shipped_drafters(tmp_path)) == ["sd2", "pretrained", "custom"]
    assert shipped_drafters(tmp_path / "missing") == {}


def test_prepare_checks_a_request_once_and_the_prepared_request_runs_as_it_is(engine):
    decode = DecodeConfig(k=3, max_new_tokens=12)
    request = GenerateRequest(prompt="Tell me a story.", method="tiny", decode=decode)
    prepared = engine.prepare(request)
    assert prepared.prompt_ids == tuple(engine.encode(request)) and prepared.drafter is engine.drafter("tiny")
    assert not prepared.steered  # the tiny drafter has no head
    calls = []
    real = engine.tokenizer.apply_chat_template

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    engine.tokenizer.apply_chat_template = counted
    try:
        from_prepared = engine.generate(prepared)
    finally:
        engine.tokenizer.apply_chat_template = real
    assert calls == []  # a prepared request is not encoded again
    assert from_prepared.token_ids == engine.generate(request).token_ids
    assert from_prepared.prompt_tokens == len(prepared.prompt_ids)


def test_refusals_carry_their_field(engine):
    with pytest.raises(UnknownMethodError) as unknown:
        engine.prepare(GenerateRequest(prompt="hi", method="sd3"))
    assert unknown.value.field == "method"
    with pytest.raises(InvalidValue) as empty:
        engine.prepare(GenerateRequest(messages=(), method="verifier"))
    assert empty.value.field == "messages"
    with pytest.raises(UnknownDrafterError, match="loaded: tiny") as missing:
        engine.drafter("nope")
    assert missing.value.field == "drafter"


def test_load_drafter_registers_a_folder_under_its_name(tiny_pair_dir, steered_drafter_dir):
    verifier_dir, _ = tiny_pair_dir
    engine = Engine.load(verifier=str(verifier_dir))
    assert engine.drafter_names() == []
    loaded = engine.load_drafter("late", steered_drafter_dir)
    assert engine.drafter("late") is loaded and engine.loaded_drafters() == [loaded]
    assert "late" in engine.methods() and loaded.head is not None
    assert engine.prepare(GenerateRequest(prompt="Hello!", method="late")).steered


@pytest.mark.parametrize("method", ["verifier", "tiny"])
def test_a_time_budget_ends_the_run_at_a_block_and_keeps_its_output(engine, method):
    """Past its budget a run stops after the block in hand (here: the prefill's, budget 0), reports
    finish_reason "time", and what it emitted is the start of the unbounded run's output."""
    request = GenerateRequest(
        prompt="Tell me a story.", method=method, decode=DecodeConfig(max_new_tokens=24)
    )
    full = engine.generate(request)
    cut = engine.generate(request, time_budget_s=0.0)
    assert full.finish_reason == "length" and len(full.token_ids) == 24
    assert cut.finish_reason == "time"
    assert len(cut.blocks) == 1 and 1 <= len(cut.token_ids) < 24
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)]
    assert cut.metrics.n_tokens == len(cut.token_ids)
    roomy = engine.generate(request, time_budget_s=3600.0)
    assert roomy.finish_reason == "length" and roomy.token_ids == full.token_ids


def test_a_run_that_completes_as_its_budget_ends_is_not_reported_as_cut(engine):
    one = GenerateRequest(prompt="Hi", decode=DecodeConfig(max_new_tokens=1))
    assert engine.generate(one, time_budget_s=0.0).finish_reason == "length"
