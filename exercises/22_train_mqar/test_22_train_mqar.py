"""Check for exercise 22 (you do not need to edit this file): the cross-entropy, RMSNorm's backward, the AdamW
update, the clip by the global norm, the model's forward and backward and the evaluation against minilin.nn's (in float64, and the
gradients also against central finite differences); two training steps against the same two steps made with
minilin.nn's AdamW and backward; then a whole training run on a fixed seed, which must learn: the held-out
loss must fall below LOSS_AFTER and the accuracy rise above ACCURACY_AFTER (a correct solution reaches a loss
of about 0.01 and an accuracy above 0.99 in about 2 s of CPU). minilin's own LanguageModel.loss_and_grads
and LanguageModel.backward are refused while your functions run: the gradients must be yours. The training
runs with one BLAS thread (its products are small: more threads mostly wait on each other)."""
import contextlib
import copy
import time

import numpy as np

from minilin.course.checks import CheckFailure, assert_close, blas_threads, check_gradients, fail, unpack
from minilin.nn import AdamW, LanguageModel, Module, RMSNorm, accuracy, clip_grad_norm, cross_entropy
from minilin.train.mqar import MQAR, batch, held_out

TASK = MQAR(vocab=32, seq_len=24, num_kv_pairs=4)
LOSS_AFTER, ACCURACY_AFTER = 0.4, 0.9


@contextlib.contextmanager
def _own_backward(function):
    """LanguageModel.loss_and_grads and .backward raise while `function` runs."""
    saved = {name: getattr(LanguageModel, name) for name in ("loss_and_grads", "backward")}

    def refuse(name):
        def refused(self, *args, **kwargs):
            raise CheckFailure(f"{function}() calls LanguageModel.{name}: that is minilin's own backward. Write the "
                               "head's, the final norm's and the embedding's backward yourself, and call "
                               "block.backward(ctx, dx) for the blocks")
        return refused

    for name in saved:
        setattr(LanguageModel, name, refuse(name))
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(LanguageModel, name, method)


def _logits_and_targets(seed, shape=(2, 7, 11), loud=1.0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    logits = (loud * rng.standard_normal(shape)).astype(dtype)
    targets = rng.integers(0, shape[-1], shape[:-1])
    targets[rng.random(shape[:-1]) < 0.5] = -100
    targets.flat[0] = 3                                    # at least one counted position
    return logits, targets


def test_cross_entropy(learner):
    for seed, (shape, loud, dtype) in enumerate([((2, 7, 11), 1.0, np.float64), ((1, 1, 5), 1.0, np.float64),
                                                 ((3, 4, 6), 1000.0, np.float64), ((2, 5, 9), 1.0, np.float32)], 700):
        logits, targets = _logits_and_targets(seed, shape, loud, dtype)
        expected_loss, expected_grad, _ = cross_entropy(logits, targets)
        with np.errstate(all="ignore"):
            loss, dlogits = unpack("cross_entropy(logits, targets)", learner.cross_entropy(logits, targets), 2,
                                   "(loss, dlogits)")
        where = f"[logits {list(shape)} {np.dtype(dtype).name}" + (
            f", times {loud:g}: subtract the row max]" if loud > 1 else "]")
        assert_close(f"cross_entropy: loss {where}", loss, np.float64(expected_loss),
                     rtol=1e-8 if dtype == np.float64 else 1e-5)
        if dtype == np.float64:
            check_gradients("cross_entropy", (dlogits,), (expected_grad,), names=("dlogits",), dims=("B T V",),
                            where=where, loss=lambda z: cross_entropy(z, targets)[0], inputs=(logits,), seed=seed)
        else:
            assert_close(f"cross_entropy: dlogits {where}", dlogits, expected_grad, dims="B T V")


def test_rms_norm_backward(learner):
    for seed, (shape, eps) in enumerate([((2, 5, 8), None), ((1, 1, 3), None), ((3, 4, 6), 0.5)], 710):
        rng = np.random.default_rng(seed)
        x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
        weight = rng.uniform(0.5, 1.5, shape[-1])
        kwargs = {} if eps is None else {"eps": eps}
        layer = RMSNorm(shape[-1], dtype=np.float64, **kwargs)
        layer.weight[...] = weight
        _, ctx = layer.forward(x)
        dx = layer.backward(ctx, dy)
        got = learner.rms_norm_backward(x, weight, dy, **kwargs)

        def loss(x, w):
            norm = RMSNorm(shape[-1], dtype=np.float64, **kwargs)
            norm.weight[...] = w
            return float(np.sum(dy * norm.forward(x)[0]))

        check_gradients(f"rms_norm_backward(eps={1e-6 if eps is None else eps:g})", got, (dx, layer.grads["weight"]),
                        names=("dx", "dweight"), dims=("B T D", "D"), where=f"[x {list(shape)}]", loss=loss,
                        inputs=(x, weight), seed=seed)


def test_adamw_update(learner):
    for seed, (shape, decay, step, betas, weight_decay) in enumerate(
            [((4, 3), True, 1, (0.9, 0.98), 0.1), ((5,), False, 7, (0.9, 0.98), 0.1),
             ((3, 2), False, 3, (0.8, 0.95), 0.3), ((2, 6), True, 12, (0.8, 0.95), 0.3)], 720):
        rng = np.random.default_rng(seed)
        param, grad = rng.standard_normal(shape), rng.standard_normal(shape)
        m, v = 0.1 * rng.standard_normal(shape), 0.1 * rng.uniform(0.0, 1.0, shape)
        if step == 1:
            m, v = np.zeros(shape), np.zeros(shape)
        # minilin's AdamW decays the matrices whose name does not end with conv.weight
        name = "w" if decay else ("conv.weight" if len(shape) >= 2 else "gain")
        holder = Module()
        holder.add_param(name, param.copy())
        holder.grads[name][...] = grad
        optimizer = AdamW(holder, lr=0.01, betas=betas, eps=1e-8, weight_decay=weight_decay)
        optimizer.step_count = step - 1
        optimizer.m[name][...], optimizer.v[name][...] = m, v
        optimizer.step()
        kwargs = dict(lr=0.01, betas=betas, eps=1e-8, weight_decay=weight_decay, decay=decay)
        result = learner.adamw_update(param, grad, m, v, step, **kwargs)
        new_param, new_m, new_v = unpack("adamw_update(...)", result, 3, "(param, m, v)")
        where = f"[shape {list(shape)}, step {step}, decay={decay}, betas={betas}, weight_decay={weight_decay}]"
        assert_close(f"adamw_update: m {where}", new_m, optimizer.m[name])
        assert_close(f"adamw_update: v {where}", new_v, optimizer.v[name])
        assert_close(f"adamw_update: param {where}", new_param, holder.params[name])


def test_clip_by_global_norm(learner):
    for seed, (shapes, max_norm, size) in enumerate([([(3, 4), (5,), (2, 2, 2)], 1.0, 1.0), ([(6,)], 1.0, 0.01),
                                                      ([(2, 3), (4,)], 0.5, 0.3), ([(7, 2)], 2.0, 3.0),
                                                      ([(3,)] * 20 + [(2, 2)] * 20, 1.0, 1.0)], 740):   # a model's worth
        rng = np.random.default_rng(seed)
        grads = [size * rng.standard_normal(shape) for shape in shapes]
        holder = Module()
        for i, g in enumerate(grads):
            holder.add_param(f"p{i}", np.zeros(g.shape))
            holder.grads[f"p{i}"][...] = g
        expected_norm = clip_grad_norm(holder, max_norm)
        kwargs = {} if max_norm == 1.0 else {"max_norm": max_norm}
        clipped, norm = unpack("clip_by_global_norm(grads)", learner.clip_by_global_norm(grads, **kwargs), 2,
                               "(clipped, norm)")
        listed = f"{shapes}" if len(shapes) <= 4 else f"{shapes[:4]}..."
        where = f"[{len(shapes)} arrays of shapes {listed}, max_norm={max_norm:g}, ||g|| = {expected_norm:.3g}]"
        assert_close(f"clip_by_global_norm: the norm ||g|| {where}", norm, np.float64(expected_norm))
        clipped = unpack(f"clip_by_global_norm: the clipped gradients {where}", clipped, len(grads),
                         "with one array per gradient")
        for i, got in enumerate(clipped):
            assert_close(f"clip_by_global_norm: gradient {i} {where}", got, holder.grads[f"p{i}"])


def _small_model(seed, dtype=np.float64):
    return LanguageModel(["attention", "attention"], vocab=TASK.vocab, d_model=16, heads=2, seed=seed, dtype=dtype)


def test_loss_and_grads(learner):
    model = _small_model(3)
    tokens, targets = batch(TASK, 0, 4, seed=5)
    reference = copy.deepcopy(model)
    reference.zero_grad()
    expected_loss, _ = reference.loss_and_grads(tokens, targets)
    named = list(reference.named_params())
    model.zero_grad()
    with _own_backward("loss_and_grads"):
        loss = learner.loss_and_grads(model, tokens, targets)
    where = "[two attention blocks, d_model 16, float64, a batch of 4]"
    assert_close(f"loss_and_grads: the loss {where}", loss, np.float64(expected_loss))
    got = tuple(g.copy() for _, _, g in model.named_params())
    probe = copy.deepcopy(reference)
    params = [p for _, p, _ in probe.named_params()]

    def full_loss(*values):
        for p, value in zip(params, values):
            p[...] = value
        return cross_entropy(probe.forward(tokens)[0], targets)[0]

    check_gradients("loss_and_grads: the gradient of", got, tuple(g for _, _, g in named),
                    names=tuple(f"d{name}" for name, _, _ in named), dims=tuple("" for _ in named), where=where,
                    loss=full_loss, inputs=tuple(p.copy() for _, p, _ in named), seed=730)
    with _own_backward("loss_and_grads"):
        learner.loss_and_grads(model, tokens, targets)      # a second time, without zero_grad: the sums double
    for (name, _, expected), (_, _, g) in zip(named, model.named_params()):
        assert_close(f"loss_and_grads called twice without zero_grad: {name}'s gradient (add into grads with +=, "
                     "never assign)", g, 2 * expected)


def test_evaluate(learner):
    model = _small_model(4)
    tokens, targets = held_out(TASK, 16, seed=6)
    logits = model.forward(tokens)[0]
    loss, acc = unpack("evaluate(model, tokens, targets)", learner.evaluate(model, tokens, targets), 2,
                       "(loss, accuracy)")
    assert_close("evaluate: the loss [16 held-out examples, float64]", loss, np.float64(cross_entropy(logits, targets)[0]))
    assert_close("evaluate: the accuracy [16 held-out examples]", acc, np.float64(accuracy(logits, targets)))


def _returned_model(result, steps):
    model, acc = unpack(f"train(steps={steps})", result, 2, "(model, accuracy)")
    if not isinstance(model, LanguageModel) or list(model.mixers) != ["attention", "attention"] or model.d_model != 32:
        fail(f"train(steps={steps}): expected the trained LanguageModel(['attention', 'attention'], d_model=32, ...) "
             f"first, got {type(model).__name__}")
    return model, acc


def _held_out_scores(model, seed):
    tokens, targets = held_out(TASK, 256, seed)
    logits = model.forward(tokens)[0]
    return cross_entropy(logits, targets)[0], accuracy(logits, targets)


def test_two_training_steps(learner):
    """Two steps of the loop against the same two steps made with minilin.nn: the batches, zero_grad, the clip
    to a global norm of 1, AdamW's step count from 1, weight decay on the matrices, the parameters written back."""
    with _own_backward("train"), blas_threads(1):
        model, acc = _returned_model(learner.train(steps=2, batch_size=4, seed=3), 2)
    reference = LanguageModel(["attention", "attention"], vocab=TASK.vocab, d_model=32, heads=2, seed=3)
    optimizer = AdamW(reference, lr=1e-2, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.1)
    for step in range(2):
        tokens, targets = batch(TASK, step, 4, 3)
        reference.zero_grad()
        reference.loss_and_grads(tokens, targets)
        clip_grad_norm(reference, 1.0)
        optimizer.step()
    for (name, p, _), (_, expected, _) in zip(model.named_params(), reference.named_params()):
        assert_close(f"train(steps=2, batch_size=4, seed=3): {name} after the two steps [float32]", p, expected)
    assert_close("train(steps=2, batch_size=4, seed=3): the accuracy returned (that of the model on "
                 "held_out(TASK, 256, seed), from your evaluate)", acc, np.float64(_held_out_scores(model, 3)[1]))


def test_training_learns(learner):
    seed = 0
    before = _held_out_scores(LanguageModel(["attention", "attention"], vocab=TASK.vocab, d_model=32, heads=2,
                                            seed=seed), seed)
    began = time.process_time()
    with _own_backward("train"), blas_threads(1):      # small products: one BLAS thread is the fastest
        model, acc = _returned_model(learner.train(), 150)
    seconds = time.process_time() - began
    after = _held_out_scores(model, seed)
    assert_close("train(): the accuracy returned (that of the trained model on held_out(TASK, 256, seed), from "
                 "your evaluate)", acc, np.float64(after[1]))
    if not (after[0] <= LOSS_AFTER and after[1] >= ACCURACY_AFTER):
        fail(f"train() did not learn enough: after 150 steps ({seconds:.1f} s of CPU) the held-out loss is {after[0]:.3f} "
             f"(it was {before[0]:.3f} before training) and the accuracy {after[1]:.3f} (it was {before[1]:.3f}; "
             f"chance is 1/16).\n  A correct solution reaches a loss below {LOSS_AFTER} and an accuracy above "
             f"{ACCURACY_AFTER} on this seed (about 0.01 and above 0.99). If the checks of the pieces pass, look at the "
             "loop: the batch of step i, zero_grad before each step, the clip, adamw_update's step count from 1, "
             "and the new parameters written back into the model (p[...] = new).")
