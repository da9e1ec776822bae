"""Training the GPT on the bundled Shakespeare, one process: what ``minidist train --model gpt`` runs.

The text is cut into a training part (the first 90 %) and a validation part
(the last 10 %, text the model never sees), encoded one token per character,
and the model is trained on random windows of the training part:

    for each step:
        x, y = batch_size windows of block_size tokens, y shifted by one
        loss = cross_entropy(model(x), y)       mean over B * T predictions
        backward, AdamW step, learning rate from the schedule

The optimizer is nanoGPT's: AdamW with betas (0.9, 0.99), weight decay 0.1
on the weight matrices and embeddings only (not on biases and LayerNorm
gains), the rate warmed up linearly over the first steps and then brought
down along half a cosine to a tenth of its peak. Every ``eval_every`` steps
the loss is measured on the same fixed windows of both parts (so two
measurements differ because the model changed, not the windows), and at the
end the model writes a sample.

Before anything is built, :func:`check_run` refuses a run that cannot
start: a context longer than the validation text holds, or a step whose
bytes (:func:`training_bytes`: the parameters and their state, the
activations, attention's B H T^2 probabilities among them) would outgrow
the share of this machine's memory a run may take.

What to expect: a model that knows nothing predicts every one of the 62
characters with the same probability, a loss of ln 62 = 4.13 nats. The
characters' frequencies alone give 3.32 on the validation text, the
frequencies of pairs (the previous character known) 2.46; below about 2.0
the sample is made of words, speakers' names and verse lines. The default
configuration passes 2.0 after about 1,000 steps and ends near 1.75 after
2,000 (README, "Training a GPT", gives the figures measured).
"""

from __future__ import annotations

import math
import time

import numpy as np

from minidist import backend, no_grad, optim
from minidist.data import CharTokenizer, RandomWindows, load_shakespeare, split_tokens
from minidist.memory import transformer_block_activation_bytes
from minidist.models import GPT, GPTConfig, generate
from minidist.nn import functional as F
from minidist.runtime.allocator import keep_freed_memory
from minidist.runtime.blas_threads import blas_threads, set_blas_threads
from minidist.runtime.machine_memory import MEMORY_SHARE, memory_available
from minidist.units import format_bytes

#: The default run: nanoGPT's CPU configuration for character-level
#: Shakespeare (4 layers, 4 heads, width 128, context 64, batch 12, AdamW at
#: 1e-3). Measured: validation loss 1.75 after 2,000 steps, about 5 minutes
#: of one core (README, "Training a GPT").
GPT_DEFAULTS = {
    "steps": 2000,
    "n_layer": 4,
    "n_head": 4,
    "n_embd": 128,
    "block_size": 64,
    "batch_size": 12,
    "lr": 1e-3,
    "eval_every": 200,
}
VAL_FRACTION = 0.1
EVAL_BATCHES = 20  # windows per loss estimate: EVAL_BATCHES * batch_size of them
WARMUP_STEPS = 100
WEIGHT_DECAY = 0.1
BETAS = (0.9, 0.99)  # beta2 below Adam's 0.999: fewer tokens per step, noisier gradients
SAMPLE_CHARS = 300
SAMPLE_TEMPERATURE = 0.8


def build_gpt(vocab_size: int | None = None, n_layer: int = GPT_DEFAULTS["n_layer"],
              n_head: int = GPT_DEFAULTS["n_head"], n_embd: int = GPT_DEFAULTS["n_embd"],
              block_size: int = GPT_DEFAULTS["block_size"], seed: int = 0, dtype=np.float32) -> GPT:
    """A GPT initialised from ``seed``; ``vocab_size`` None means the
    bundled text's (62 characters)."""
    if vocab_size is None:
        vocab_size = CharTokenizer(load_shakespeare()).vocab_size
    config = GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer, n_head=n_head,
                       n_embd=n_embd)
    return GPT(config, rng=np.random.default_rng(seed), dtype=dtype)


def gpt_parameters(vocab_size: int, n_layer: int, n_embd: int, block_size: int) -> int:
    """The parameters of :func:`build_gpt`'s model, counted without building
    it: per block 12 h^2 + 13 h (the four Linear layers' weights and biases,
    the two LayerNorms), the token embedding (tied to the output layer, so
    counted once) V h, the positions T h, the final LayerNorm 2 h."""
    h = n_embd
    return n_layer * (12 * h * h + 13 * h) + vocab_size * h + block_size * h + 2 * h


def training_bytes(vocab_size: int, n_layer: int, n_head: int, n_embd: int, block_size: int,
                   batch_size: int, itemsize: int = 4) -> dict[str, int]:
    """The bytes one training step holds at its peak, by what they are for
    (the float32 arrays this module trains with; ``sum(...values())`` is
    the whole):

    * the parameters, their gradients and AdamW's two moments: 4 arrays of
      :func:`gpt_parameters` numbers;
    * the activations the graph keeps for the backward: each block's
      (:func:`minidist.memory.transformer_block_activation_terms`, the B H T^2
      attention probabilities among them), the embeddings' and the final
      LayerNorm's (B, T, h) arrays, and the logits with their softmax (B, T, V);
    * the backward's largest temporaries: one block's gradients of the
      probabilities and of the scores (B H T^2 each) and the logits' gradient.

    Measured against a step's peak (tracemalloc), it is over by a tenth to a
    fifth: a bound to refuse a run by, not an account to the byte
    (:class:`minidist.memory.Ledger` measures one)."""
    b, t, h, v = batch_size, block_size, n_embd, vocab_size
    s = b * t * h * itemsize  # one (B, T, h) array
    logits = b * t * v * itemsize
    scores = b * n_head * t * t * itemsize
    return {
        "parameters, gradients and AdamW's moments":
            4 * gpt_parameters(v, n_layer, h, t) * itemsize,
        "activations": (n_layer * transformer_block_activation_bytes(b, t, h, n_head, itemsize)
                        + 4 * s + t * h * itemsize + b * t * itemsize + 3 * logits),
        "the backward's temporaries": 2 * scores + logits,
    }


def _longest_context_that_fits(budget: float, vocab_size, n_layer, n_head, n_embd, block_size,
                               batch_size) -> int:
    """The largest context below ``block_size`` whose step fits ``budget`` (0: none),
    by bisection: the bytes grow with the context."""
    low, high = 0, block_size - 1
    while low < high:
        middle = (low + high + 1) // 2
        need = sum(training_bytes(vocab_size, n_layer, n_head, n_embd, middle,
                                  batch_size).values())
        low, high = (middle, high) if need <= budget else (low, middle - 1)
    return low


def check_run(settings: dict, vocab_size: int, train_tokens: int, val_tokens: int) -> None:
    """Refuse, in one line (ValueError), a run that cannot start: a context
    longer than a part of the text holds (a window is context + 1 tokens),
    or a step estimated (:func:`training_bytes`) over the share of this
    machine's memory a run may take (:mod:`minidist.runtime.machine_memory`), saying
    what to lower. Before anything is built: a step too big for the machine
    would otherwise be stopped by the kernel partway into the first one."""
    block = settings["block_size"]
    shortest = min(train_tokens, val_tokens)
    if block + 1 > shortest:
        part = "validation" if val_tokens <= train_tokens else "training"
        raise ValueError(
            f"a context (--context, block_size) of {block:,} is longer than the text can give: "
            f"a window is context + 1 characters and the {part} part holds {shortest:,} "
            f"(of {train_tokens + val_tokens:,}); choose a context of at most {shortest - 1:,}")
    shape = (vocab_size, settings["n_layer"], settings["n_head"], settings["n_embd"])
    need = training_bytes(*shape, block, settings["batch_size"])
    available = memory_available()
    budget = MEMORY_SHARE * available
    if sum(need.values()) <= budget:
        return
    terms = ", ".join(f"{name} {format_bytes(value)}" for name, value in need.items())
    if need["parameters, gradients and AdamW's moments"] > budget:
        lower = "--width or --layers: the parameters grow with layers x width^2"
    else:
        fits = _longest_context_that_fits(budget, *shape, block, settings["batch_size"])
        context = f"--context (to {fits:,} or less, the rest unchanged)" if fits else "--context"
        lower = (f"{context}, --batch-size, --heads or --layers: the attention's probabilities "
                 "grow with batch x heads x context^2, a block's other activations with batch x "
                 "context x width")
    raise ValueError(
        f"this GPT (context {block:,}, batch {settings['batch_size']}, {settings['n_layer']} "
        f"layers of width {settings['n_embd']} and {settings['n_head']} heads) would need "
        f"about {format_bytes(sum(need.values()))} a step ({terms}); this machine has "
        f"{format_bytes(available)} available and a run may take {MEMORY_SHARE:.0%} of it. "
        f"Lower {lower}")


def language_model_loss(model, x, y):
    """Mean cross-entropy of ``model(x)`` (B, T, V) against the next tokens ``y`` (B, T)."""
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), np.asarray(y).reshape(-1))


def estimate_loss(model, tokens, block_size: int, batch_size: int, batches: int = EVAL_BATCHES,
                  seed: int = 0) -> float:
    """The mean loss over ``batches`` batches of windows of ``tokens`` drawn
    from ``seed`` (the same windows every call), in eval mode, no graph."""
    windows = RandomWindows(tokens, block_size, batch_size, seed=seed)
    was_training = model.training
    model.eval()
    try:
        with no_grad():
            losses = [language_model_loss(model, *windows.sample()).item() for _ in range(batches)]
    finally:
        model.train(was_training)
    return float(np.mean(losses))


def _optimizer(model, lr: float):
    """AdamW, decaying the matrices (2-D: Linear weights, embeddings) and not the vectors."""
    decay = [p for p in model.parameters() if p.data.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.data.ndim < 2]
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]
    return optim.AdamW(groups, lr=lr, betas=BETAS)


def _schedule(optimizer, steps: int, lr: float):
    """Linear warm-up, then half a cosine down to lr / 10 at the last step."""
    warmup = min(WARMUP_STEPS, max(steps // 10, 1))
    cosine = optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(steps - warmup, 1), eta_min=lr / 10)
    return optim.lr_scheduler.WarmupThen(optimizer, warmup, cosine, start_factor=0.1)


def train_gpt(
    steps: int | None = None,
    n_layer: int | None = None,
    n_head: int | None = None,
    n_embd: int | None = None,
    block_size: int | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    eval_every: int | None = None,
    seed: int = 0,
    sample_chars: int | None = None,
    eval_batches: int = EVAL_BATCHES,
    progress: bool = True,
    console=None,
    threads: int | None = 1,
    text: str | None = None,
) -> dict:
    """Train a character-level GPT on ``text`` (None: the bundled Shakespeare).

    Every argument left None takes its value from :data:`GPT_DEFAULTS`
    (``sample_chars``: 300 characters of generated text).
    Returns a dict: ``model``, ``tokenizer``, ``history`` (one entry per
    evaluation: ``step``, ``train_loss``, ``val_loss``, ``lr``),
    ``val_loss`` (the last), ``sample`` (the generated text), ``seconds``
    (training time, evaluations included) and ``tokens_per_s``.

    ``threads``: BLAS threads while training, restored afterwards (None
    leaves them alone); one by default, as ``minidist train`` for the digits:
    these matrices are small, and a BLAS thread waiting for a busy core
    stalls every product.
    """
    settings = dict(steps=steps, n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
                    batch_size=batch_size, lr=lr, eval_every=eval_every)
    settings = {name: GPT_DEFAULTS[name] if value is None else value for name, value in settings.items()}
    for name, value in settings.items():
        if name != "lr" and (not isinstance(value, (int, np.integer)) or value < 1):
            raise ValueError(f"train_gpt: {name} must be a positive int, got {value!r}")
    if not settings["lr"] > 0:
        raise ValueError(f"train_gpt: lr must be > 0, got {settings['lr']!r}")
    sample_chars = SAMPLE_CHARS if sample_chars is None else sample_chars
    if sample_chars < 0 or eval_batches < 1:
        raise ValueError(f"train_gpt: need sample_chars >= 0 and eval_batches >= 1, got {sample_chars}, {eval_batches}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive int (BLAS threads), or None to leave them alone; got {threads!r}")

    keep_freed_memory()  # each step frees and reallocates the same arrays: keep the pages
    previous_threads = blas_threads() if threads is not None else {}
    if threads is not None:
        set_blas_threads(threads)
    try:
        return _train(settings, seed, sample_chars, eval_batches, progress, console,
                      load_shakespeare() if text is None else text)
    finally:
        if previous_threads:
            set_blas_threads(max(previous_threads.values()))


def _train(s, seed, sample_chars, eval_batches, progress, console, text) -> dict:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    tokenizer = CharTokenizer(text)
    train_tokens, val_tokens = split_tokens(tokenizer.encode(text), VAL_FRACTION)
    check_run(s, tokenizer.vocab_size, len(train_tokens), len(val_tokens))
    block, batch = s["block_size"], s["batch_size"]
    windows = RandomWindows(train_tokens, block, batch, seed=seed)
    model = build_gpt(tokenizer.vocab_size, s["n_layer"], s["n_head"], s["n_embd"], block, seed=seed)
    optimizer = _optimizer(model, s["lr"])
    scheduler = _schedule(optimizer, s["steps"], s["lr"])

    def measure(step):
        # Fixed windows (seed + 1 for train, seed + 2 for validation): the curve moves only with the model.
        train = estimate_loss(model, train_tokens, block, batch, eval_batches, seed=seed + 1)
        val = estimate_loss(model, val_tokens, block, batch, eval_batches, seed=seed + 2)
        return {"step": step, "train_loss": train, "val_loss": val, "lr": optimizer.param_groups[0]["lr"]}

    console = console or Console()
    layers = f"{s['n_layer']} layer" + ("s" if s["n_layer"] != 1 else "")
    console.print(
        f"[bold]minidist train[/bold]: gpt on Shakespeare ({len(train_tokens):,} train / {len(val_tokens):,} "
        f"validation characters, {tokenizer.vocab_size} tokens), {layers} x {s['n_head']} heads, "
        f"width {s['n_embd']}, context {block}, {model.num_parameters():,} parameters, batch {batch}, "
        f"AdamW lr {s['lr']:g}, {s['steps']} steps, backend {backend.name()}"
    )
    console.print(f"uniform guess: loss ln {tokenizer.vocab_size} = {math.log(tokenizer.vocab_size):.2f}")
    history = [measure(0)]
    console.print(f"step {0:>5}: train {history[0]['train_loss']:.3f}  val {history[0]['val_loss']:.3f}")
    columns = (
        TextColumn("step"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("loss {task.fields[loss]:.3f}  val {task.fields[val]:.3f}  {task.fields[rate]:,.0f} tokens/s"),
        TimeRemainingColumn(),
    )
    start = time.perf_counter()
    running = None
    with Progress(*columns, console=console, disable=not progress, transient=False) as bar:
        task = bar.add_task("train", total=s["steps"], loss=float("nan"), val=history[0]["val_loss"], rate=0.0)
        for step in range(1, s["steps"] + 1):
            x, y = windows.sample()
            loss = language_model_loss(model, x, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            value = loss.item()
            running = value if running is None else 0.95 * running + 0.05 * value
            if step % s["eval_every"] == 0 or step == s["steps"]:
                history.append(measure(step))
                console.print(f"step {step:>5}: train {history[-1]['train_loss']:.3f}  "
                              f"val {history[-1]['val_loss']:.3f}")
            rate = step * batch * block / max(time.perf_counter() - start, 1e-9)
            bar.update(task, advance=1, loss=running, val=history[-1]["val_loss"], rate=rate)
    seconds = time.perf_counter() - start

    prompt = tokenizer.encode("\n")
    sample = tokenizer.decode(generate(model, prompt, sample_chars, temperature=SAMPLE_TEMPERATURE, seed=seed)[1:])
    console.print(f"validation loss [bold]{history[-1]['val_loss']:.3f}[/bold] after {s['steps']} steps "
                  f"({seconds:.0f} s); a sample (temperature {SAMPLE_TEMPERATURE}):")
    console.print(sample, markup=False, highlight=False)
    return {
        "model": model,
        "tokenizer": tokenizer,
        "history": history,
        "val_loss": history[-1]["val_loss"],
        "sample": sample,
        "seconds": seconds,
        "tokens_per_s": s["steps"] * batch * block / max(seconds, 1e-9),
    }


__all__ = ["GPT_DEFAULTS", "build_gpt", "check_run", "estimate_loss", "gpt_parameters",
           "language_model_loss", "train_gpt", "training_bytes"]
