"""numpy transcriptions of the original's TensorFlow models (capsule networks, encoder-decoder CNN): the
oracles of their ports and of their converted checkpoints."""

from __future__ import annotations

import numpy as np


# ---------------------------------------------------------------- the original, op by op in numpy
def original_squash(s: np.ndarray, epsilon: float = 1e-7) -> np.ndarray:
    """``ops.squash(s, axis=-1, epsilon=1e-7)``."""
    squared_norm = np.sum(np.square(s), axis=-1, keepdims=True)
    sn = np.sqrt(squared_norm + epsilon)
    squash_factor = squared_norm / (1.0 + squared_norm)
    squash_factor = squash_factor / sn
    return squash_factor * s


def original_softmax(logits: np.ndarray) -> np.ndarray:
    """``tf.nn.softmax`` (last axis)."""
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def original_capsule(inputs: np.ndarray, kernel: np.ndarray, init_logits: np.ndarray, routing_iters: int
                     ) -> np.ndarray:
    """``layer.Capsule.call``: ``predict`` (map_fn of tensordot over the input capsules, logits tiled over the
    shared axes) then ``cluster`` (a while_loop of ``routing_iters`` bodies, then m_step and squash)."""
    rank = inputs.ndim
    shared = rank - 2
    x = np.transpose(inputs, [shared, *range(shared), rank - 1])  # input capsules first
    predictions = np.stack([np.tensordot(x[i], kernel[i], axes=[[shared], [0]]) for i in range(x.shape[0])])
    predictions = np.transpose(predictions, [*range(1, shared + 1), 0, rank - 1, rank])  # [..., Nin, Nout, Dout]
    logits = init_logits
    for i in range(shared):
        logits = np.tile(logits[None], [predictions.shape[shared - i - 1]] + [1] * logits.ndim)

    def m_step(l: np.ndarray) -> np.ndarray:
        w = original_softmax(l)
        return np.sum(w[..., None] * predictions, axis=-3)

    for _ in range(routing_iters):
        caps = original_squash(m_step(logits))
        similarity = np.sum(predictions * caps[..., None, :, :], axis=-1)
        logits = logits + similarity
    return original_squash(m_step(logits))


def original_capsnet(inputs: np.ndarray, dense_kernel: np.ndarray, kernels: list[np.ndarray],
                     logits: list[np.ndarray], num_capsules: int, capsule_dim: int, routing_iters: int) -> np.ndarray:
    """``CapsNet._get_outputs`` in test mode: dense (no bias), reshape, squash, the capsule layers, reshape."""
    b, t = inputs.shape[:2]
    primary = np.tensordot(inputs, dense_kernel, axes=[[2], [0]]).reshape(b, t, num_capsules, capsule_dim)
    output = original_squash(primary)
    for kernel, init in zip(kernels, logits):
        output = original_capsule(output, kernel, init, routing_iters)
    return output.reshape(b, t, num_capsules * capsule_dim)


# ---------------------------------------------------------------- dbr_capsnet: the recurrent capsule network
def original_rnn_linear_out(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """``RNNCellLinearOut`` over one sequence [t, in]: output ``[x, h] W + b``, state its tanh."""
    h = np.zeros(kernel.shape[1])
    out = []
    for frame in x:
        gate_inputs = np.concatenate([frame, h]) @ kernel + bias
        out.append(gate_inputs)
        h = np.tanh(gate_inputs)
    return np.array(out)


def original_rec_capsule_cell(inputs: np.ndarray, state: np.ndarray, w: dict, routing_iters: int,
                              rec_only_vote: bool, probability: str, acc_in: bool, acc_state: bool) -> np.ndarray:
    """``RecCapsuleCell.call`` / ``RecCapsuleCellRecOnlyVote.call`` for one frame of one sequence (shared axes
    none): predict with einsum 'wx,wxyz->wyz', logits from the init variables, the while loop, the final m step."""
    u = np.einsum("wx,wxyz->wyz", inputs, w["input_kernel"])
    v = np.einsum("wx,wxyz->wyz", state, w["recurrent_kernel"])
    init_in, init_state = w["init_input_logits"], w["init_recurrent_logits"]

    def rec_prob(l: np.ndarray) -> np.ndarray:
        return 1 / (1 + np.exp(-l)) if probability == "sigmoid" else np.ones_like(l)

    def m_step(in_l: np.ndarray, state_l: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        in_caps = np.sum(original_softmax(in_l)[..., None] * u, -3)
        state_caps = np.sum(rec_prob(state_l)[..., None] * v, -3)
        return in_caps + state_caps, in_caps, state_caps

    in_l, state_l = init_in, init_state
    for _ in range(routing_iters):
        caps = original_squash(m_step(in_l, state_l)[0])
        in_sim = np.sum(u * caps[None], -1)
        state_sim = np.sum(v * caps[None], -1)
        if not rec_only_vote:  # RecCapsuleCell's body always accumulates
            in_l, state_l = in_l + in_sim, state_l + state_sim
        else:
            in_l = in_l + in_sim if acc_in else in_sim + init_in
            state_l = state_l + state_sim if acc_state else state_sim + init_state
    caps, in_caps, _ = m_step(in_l, state_l)
    return original_squash(in_caps if rec_only_vote else caps)


def original_bidirectional(x: np.ndarray, length: int, run_fw, run_bw) -> np.ndarray:  # type: ignore[no-untyped-def]
    """``bidirectional_dynamic_rnn`` on one padded sequence: each direction over its first ``length`` frames (the
    backward one reversed), zeros after, outputs joined on the first axis after time."""
    fw, bw = run_fw(x[:length]), run_bw(x[:length][::-1])[::-1]
    out = np.concatenate([fw, bw], axis=1)
    return np.concatenate([out, np.zeros((x.shape[0] - length, *out.shape[1:]))])


# ------------------------------------------------------------------ the oracle: numpy, [T, F, C] per utterance
def conv2d_same(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """``tf.layers.conv2d(padding='same', strides=1)``: kernel ``[kt, kf, in, out]``; ``same`` pads
    ``k - 1`` zeros per axis, ``(k - 1) // 2`` of them before."""
    kt, kf = kernel.shape[:2]
    T, Fr = x.shape[:2]
    padded = np.zeros((T + kt - 1, Fr + kf - 1, x.shape[2]))
    padded[(kt - 1) // 2:(kt - 1) // 2 + T, (kf - 1) // 2:(kf - 1) // 2 + Fr] = x
    out = np.zeros((T, Fr, kernel.shape[3]))
    for a in range(kt):
        for b in range(kf):
            out += padded[a:a + T, b:b + Fr] @ kernel[a, b]
    return out + bias


def conv2d_transpose_same(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray, strides: list[int]) -> np.ndarray:
    """``tf.layers.conv2d_transpose(padding='same')``: kernel ``[kt, kf, out, in]``; the gradient of a ``same``
    convolution of the ``size * stride`` output: input ``o`` adds ``kernel[a]`` at ``o * stride + a - pad``,
    ``pad = max(k - stride, 0) // 2``."""
    (st, sf), (kt, kf) = strides, kernel.shape[:2]
    T, Fr = x.shape[:2]
    full = np.zeros(((T - 1) * st + kt, (Fr - 1) * sf + kf, kernel.shape[2]))  # every o * stride + a
    for a in range(kt):
        for b in range(kf):
            full[a:a + (T - 1) * st + 1:st, b:b + (Fr - 1) * sf + 1:sf] += x @ kernel[a, b].T
    pt, pf = max(kt - st, 0) // 2, max(kf - sf, 0) // 2
    out = np.zeros((T * st, Fr * sf, kernel.shape[2]))
    kept = full[pt:pt + T * st, pf:pf + Fr * sf]
    out[:kept.shape[0], :kept.shape[1]] = kept
    return out + bias


def max_pool_valid(x: np.ndarray, pool: list[int]) -> np.ndarray:
    """``tf.layers.max_pooling2d(pool, strides=pool, padding='valid')``: an incomplete last window dropped."""
    T, Fr = x.shape[0] // pool[0], x.shape[1] // pool[1]
    out = np.zeros((T, Fr, x.shape[2]))
    for t in range(T):
        for f in range(Fr):
            out[t, f] = x[t * pool[0]:(t + 1) * pool[0], f * pool[1]:(f + 1) * pool[1]].max(axis=(0, 1))
    return out


def max_pool_grad(pool_input: np.ndarray, grad: np.ndarray, pool: list[int]) -> np.ndarray:
    """The original's ``unpool``: ``gen_nn_ops.max_pool_grad`` with ``grad`` as the pooled output's gradient,
    VALID windows = strides: each value goes to its window's first maximum (row-major, as TensorFlow's CPU
    kernel keeps the first of equal values), zero elsewhere and where no window reached."""
    out = np.zeros_like(pool_input)
    for t in range(grad.shape[0]):
        for f in range(grad.shape[1]):
            window = pool_input[t * pool[0]:(t + 1) * pool[0], f * pool[1]:(f + 1) * pool[1]]
            first = np.argmax(window.reshape(-1, window.shape[2]), axis=0)  # row-major; argmax: the first maximum
            a, b = np.unravel_index(first, window.shape[:2])
            out[t * pool[0] + a, f * pool[1] + b, np.arange(grad.shape[2])] += grad[t, f]
    return out


ACT = {"relu": lambda v: np.maximum(v, 0), "tanh": np.tanh, "sigmoid": lambda v: 1 / (1 + np.exp(-v))}


def oracle(x: np.ndarray, w: dict[str, list], pools: list[list[int]], centre: int, bypass: str, activation: str,
           layer_norm: bool) -> np.ndarray:
    """One utterance ``[T, F]`` through the original's ``_get_outputs``, with ``bypass`` as its model.cfg value
    (``'True'``, ``'False'``, ``'unpool'``)."""
    act = ACT[activation]
    norms = iter(w["norm"])

    def layer_out(v: np.ndarray) -> np.ndarray:  # Conv2D: activation inside the conv, then batch_normalization
        v = act(v)
        if layer_norm:
            gamma, beta = next(norms)
            v = (v - 0.0) / np.sqrt(1.0 + 1e-3) * gamma + beta  # training=False: moving mean 0, variance 1
        return v

    inputs = x[:, :, None]  # tf.expand_dims(inputs, -1)
    logits = inputs
    n = len(pools)
    encoder_outputs, before_pool = [], []
    for l in range(n):
        kernel, bias = w["conv"][l]
        logits = layer_out(conv2d_same(logits, kernel, bias))
        before_pool.append(logits)
        logits = max_pool_valid(logits, pools[l])  # max_pool_filter [1, 1] (a list) still pools, as identity
        encoder_outputs.append(logits)
    for l in range(centre):
        kernel, bias = w["conv"][n + l]
        logits = layer_out(conv2d_same(logits, kernel, bias))
    for l in range(n):
        e = n - 1 - l
        if bypass == "True" and (centre > 0 or l > 0):
            decoder_input = np.concatenate([logits, encoder_outputs[e]], -1)
        else:
            decoder_input = logits
        if bypass == "unpool" and pools[e] != [1, 1]:
            decoder_input = max_pool_grad(before_pool[e], decoder_input, pools[e])
        strides = [1, 1] if bypass == "unpool" else pools[e]
        kernel, bias = w["deconv"][l]
        logits = layer_out(conv2d_transpose_same(decoder_input, kernel, bias, strides))
        wanted = inputs.shape if e == 0 else encoder_outputs[e - 1].shape
        missing_t, missing_f = wanted[0] - logits.shape[0], wanted[1] - logits.shape[1]
        logits = np.concatenate([logits, np.repeat(logits[-1:], missing_t, 0)], 0)
        logits = np.concatenate([logits, np.repeat(logits[:, -1:], missing_f, 1)], 1)
    return logits
