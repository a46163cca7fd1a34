"""The engine's per-token arithmetic (:class:`~rollwire.engine.model.StepWork`): buffers reused,
values bit for bit those of the plain float64 formula, tokens those of the plain inverse CDF."""

from __future__ import annotations

import numpy as np
import pytest

from rollwire.engine.model import SAMPLE_CHUNK, EngineModel, StepWork, log_softmax

TEMPERATURES = [0.0, 0.05, 0.7, 1.0, 1.3]


def plain_sample(lp: np.ndarray, rng: np.random.Generator) -> int:
    """The engine's sampling before StepWork: ``searchsorted(cumsum(exp(lp)), u * total)``."""
    cdf = np.cumsum(np.exp(lp))
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1]), len(lp) - 1))


def plain_top(lp: np.ndarray, k: int) -> list[tuple[int, float]]:
    idx = np.argpartition(lp, -k)[-k:]
    idx = idx[np.argsort(-lp[idx])]
    return [(int(i), float(lp[i])) for i in idx]


def logits_like_a_model(n_vocab: int, seed: int) -> np.ndarray:
    """Float32 logits with a long low tail and a few likely ids, as a language model gives."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(-4.0, 3.0, n_vocab)
    likely = min(8, n_vocab // 2)
    logits[rng.choice(n_vocab, likely, replace=False)] += rng.uniform(8, 14, likely)
    return logits.astype(np.float32)


@pytest.mark.parametrize("n_vocab", [49152, 3000, 7])  # SmolLM2's; a partial last block; tiny
@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_log_softmax_is_the_plain_formula_bit_for_bit(n_vocab, temperature):
    work = StepWork(n_vocab)
    buffer = work.lp
    for seed in range(5):
        logits = logits_like_a_model(n_vocab, seed)
        got = work.log_softmax(logits, temperature)
        assert got is buffer  # written in place, nothing allocated per token
        assert np.array_equal(got, log_softmax(logits, temperature))
        assert logits.dtype == np.float32  # the input is left alone


@pytest.mark.parametrize("n_vocab", [49152, 3000, 7])
@pytest.mark.parametrize("temperature", [0.05, 0.7, 1.0, 1.3])
def test_sampling_draws_the_plain_inverse_cdf_tokens(n_vocab, temperature):
    work = StepWork(n_vocab)
    ours, plain = np.random.default_rng(11), np.random.default_rng(11)
    for seed in range(300):
        logits = logits_like_a_model(n_vocab, seed)
        lp = work.log_softmax(logits, temperature)
        assert work.sample(ours) == plain_sample(log_softmax(logits, temperature), plain)
        assert np.array_equal(lp, log_softmax(logits, temperature))  # sampling leaves lp alone


def test_sampling_hits_every_block_and_the_far_tail():
    n_vocab = 4 * SAMPLE_CHUNK + 100
    logits = np.zeros(n_vocab, np.float32)  # uniform: each draw lands where u points
    work = StepWork(n_vocab)
    work.log_softmax(logits, 1.0)

    class Fixed:
        def __init__(self, u: float) -> None:
            self.u = u

        def random(self) -> float:
            return self.u

    for u in [0.0, 0.1, 0.25, 0.5, 0.99, 1.0 - 2.0**-53]:
        got = work.sample(Fixed(u))  # type: ignore[arg-type]
        want = plain_sample(log_softmax(logits, 1.0), Fixed(u))  # type: ignore[arg-type]
        assert got == want
    assert work.sample(Fixed(1.0 - 2.0**-53)) == n_vocab - 1  # type: ignore[arg-type]


def test_a_token_that_underflowed_to_zero_is_never_drawn():
    logits = np.full(3 * SAMPLE_CHUNK, -1e4, np.float32)
    logits[[5, SAMPLE_CHUNK + 7, 3 * SAMPLE_CHUNK - 1]] = [1.0, 0.5, 0.0]
    work = StepWork(len(logits))
    work.log_softmax(logits, 0.5)  # exp() of the rest is exactly 0.0
    rng = np.random.default_rng(0)
    drawn = {work.sample(rng) for _ in range(500)}
    assert drawn == {5, SAMPLE_CHUNK + 7, 3 * SAMPLE_CHUNK - 1}


@pytest.mark.parametrize("k", [1, 2, 5, 20])
def test_top_alternatives_are_the_plain_ones(k):
    work = StepWork(49152)
    for seed in range(10):
        lp = work.log_softmax(logits_like_a_model(49152, seed), 1.0)
        assert work.top(lp, k) == plain_top(lp, k)


def plain_generate(
    model: EngineModel, prompt: list[int], n: int, temperature: float, seed: int, top: int
) -> list[tuple[int, float, list[tuple[int, float]]]]:
    """The engine's sampling loop before StepWork, over the same backend primitives."""
    rng = np.random.default_rng(seed)
    out = []
    with model._lock:
        model._start(prompt)
        for i in range(n):
            lp = log_softmax(np.array(model._logits()), temperature)
            token = plain_sample(lp, rng) if temperature > 0 else int(np.argmax(lp))
            out.append((token, float(lp[token]), plain_top(lp, top) if top else []))
            if i + 1 < n:
                model._advance(token)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("temperature", "seed", "top"), [(1.0, 1, 1), (0.7, 2, 3), (0.0, 0, 2)])
def test_generation_is_the_plain_loop_token_for_token(reference_model, temperature, seed, top):
    model = reference_model
    prompt = model.tokenize(model.render([{"role": "user", "content": "Tell me about the sea."}]))
    gen = model.generate(
        prompt,
        max_tokens=24,
        temperature=temperature,
        seed=seed,
        top_logprobs=top,
        ignore_eos=True,
    )
    got = [(s.token_id, s.logprob, s.top) for s in gen.steps]
    assert got == plain_generate(model, prompt, 24, temperature, seed, top)
    # and a re-score of what was sampled gives back exactly the logprobs it was sampled with
    scored = model.score(prompt + gen.token_ids, len(prompt), temperature or 1.0)
    assert [v for v, _ in scored] == [s.logprob for s in gen.steps]
