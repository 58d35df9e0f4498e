"""The original's recurrent models: state-reset BLSTMs (``dbresetlstm``, with an inserted per-utterance
input), leaky BLSTMs (``leaky_dblstm*``) and plain bidirectional RNNs (``dbrnn``)."""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor, nn

from .device import HALF as _HALF, Packing, rnn_precision


class ResetBLSTM(nn.Module):
    """The original's state-reset bidirectional LSTM (``dbresetlstm``) over padded ``[B, T, D]`` input.

    Each direction of a layer keeps ``n = t_reset / group_size`` state replicas. Replica ``k`` restarts
    from a zero state before frame ``t`` (counted in the direction's own time, from the sequence's last
    valid frame for the backward one) whenever ``t % t_reset == k * group_size + group_size - 1``, and
    at ``t = 0``. A layer's output at ``t`` is the replica with the most context, ``(t + 1) //
    group_size % n``: at most ``t_reset`` frames of the past (forward) and of the future (backward).
    A deeper layer's replica reads, at each frame, the previous layer's replicas that restarted at the
    same frame (the original's ``permute_versions``), so the context does not grow with depth.
    ``t_reset`` and ``group_size`` are one value or one per layer (non-decreasing ``t_reset``).
    ``forward_reset``/``backward_reset`` off: that direction is a plain LSTM. ``separate_directions``:
    a deeper layer's forward LSTM reads only the forward outputs (backward likewise), not both.

    Computed as batched windows: every reset window of every replica is one sequence of ``t_reset``
    frames through ``nn.LSTM``. Output ``[B, T, 2*hidden]``, zero on padded frames, which never change
    valid ones. ``input_noise`` (Gaussian, on the input) in training mode only."""

    def __init__(self, input_dim: int, hidden: int, num_layers: int = 1, t_reset: int | list[int] = 10,
                 group_size: int | list[int] = 1, forward_reset: bool = True, backward_reset: bool = True,
                 separate_directions: bool = False, input_noise: float = 0.0) -> None:
        super().__init__()
        from ..base.errors import ConfigError

        t_resets = [t_reset] * num_layers if isinstance(t_reset, int) else list(t_reset)
        groups = [group_size] * num_layers if isinstance(group_size, int) else list(group_size)
        for name, values in (("t_reset", t_resets), ("group_size", groups)):
            if len(values) == 1:
                values *= num_layers
            if len(values) != num_layers or any(int(v) != v or v < 1 for v in values):
                raise ConfigError(f"ResetBLSTM {name} = {values}: give one positive integer, or one per layer "
                                  f"({num_layers})")
        if any(b < a for a, b in zip(t_resets, t_resets[1:])):
            raise ConfigError(f"ResetBLSTM t_reset = {t_resets}: a layer's t_reset must be at least the previous "
                              "layer's (as in the original)")
        if any(t % g for t, g in zip(t_resets, groups)):
            raise ConfigError(f"ResetBLSTM t_reset = {t_resets}, group_size = {groups}: each t_reset must be a "
                              "multiple of its group_size")
        if not (forward_reset or backward_reset):
            raise ConfigError("ResetBLSTM with forward_reset and backward_reset both False is a plain BLSTM; "
                              "use BLSTM (the original fails on it)")
        step = hidden if separate_directions else 2 * hidden
        self.forward_lstms = nn.ModuleList(nn.LSTM(input_dim if i == 0 else step, hidden, batch_first=True)
                                           for i in range(num_layers))
        self.backward_lstms = nn.ModuleList(nn.LSTM(input_dim if i == 0 else step, hidden, batch_first=True)
                                            for i in range(num_layers))
        self.t_resets, self.group_sizes = t_resets, groups
        self.forward_reset, self.backward_reset = forward_reset, backward_reset
        self.separate_directions, self.input_noise = separate_directions, input_noise
        self.output_dim = 2 * hidden

    def forward(self, x: Tensor, seq_lengths: Tensor) -> Tensor:
        region, x = rnn_precision(x)
        with region:
            return self._run(x, seq_lengths)

    def _run(self, x: Tensor, seq_lengths: Tensor, extra: Tensor | None = None, at: int = -1) -> Tensor:
        """The layers over ``x``; layer ``at`` (0-based) also reads the per-utterance vector ``extra``."""
        if self.training and self.input_noise > 0:
            x = x + self.input_noise * torch.randn_like(x)
        B, T = x.shape[:2]
        lengths = seq_lengths.to(x.device)
        valid = torch.arange(T, device=x.device)[None, :] < lengths[:, None]  # [B, T]
        to_fw: Tensor = x
        to_bw: Tensor = x
        acts: tuple[Tensor, Tensor] = (x, x)
        reps: tuple[Tensor | None, Tensor | None] = (None, None)
        for layer, (t_reset, group) in enumerate(zip(self.t_resets, self.group_sizes)):
            n = t_reset // group
            if layer == 0:  # every replica reads the input
                many = x[:, :, None].expand(B, T, n, x.shape[-1])
                to_fw = many if self.forward_reset else x
                to_bw = many if self.backward_reset else x
            else:
                to_fw, to_bw = _permute_replicas(acts, reps, lengths, t_reset, self.t_resets[layer - 1], group,
                                                 self.group_sizes[layer - 1], self.forward_reset,
                                                 self.backward_reset, self.separate_directions)
            if extra is not None and layer == at:  # the same vector for every frame and replica
                to_fw, to_bw = (torch.cat((v, extra[:, None, None].expand(*v.shape[:-1], -1)), dim=-1)
                                for v in (to_fw, to_bw))
            act_f, rep_f = _reset_direction(cast(nn.LSTM, self.forward_lstms[layer]), to_fw, t_reset, group,
                                            self.forward_reset)
            act_b, rep_b = _reset_direction(cast(nn.LSTM, self.backward_lstms[layer]), _reverse(to_bw, lengths), t_reset,
                                            group, self.backward_reset)
            act_b = _reverse(act_b, lengths)
            rep_b = _reverse(rep_b, lengths) if rep_b is not None else None
            acts, reps = (act_f, act_b), (rep_f, rep_b)
        return torch.where(valid[..., None], torch.cat(acts, dim=-1), 0.0)


class ResetBLSTMInsert(ResetBLSTM):
    """The original's ``dbresetlstm_insert_additional_input``: a ResetBLSTM whose layer ``combine_layer``
    (counted from 1, as the original's) also reads a per-utterance vector ``extra`` ``[B, extra_dim]``
    (e.g. an i-vector), repeated over the frames and state replicas and joined to that layer's inputs in
    both directions. Both directions must reset (the original's tiling fails otherwise)."""

    def __init__(self, input_dim: int, hidden: int, extra_dim: int, combine_layer: int = 1, num_layers: int = 1,
                 **settings: Any) -> None:
        super().__init__(input_dim, hidden, num_layers=num_layers, **settings)
        from ..base.errors import ConfigError

        if not 1 <= combine_layer <= num_layers:
            raise ConfigError(f"ResetBLSTMInsert combine_layer = {combine_layer}: a layer from 1 to num_layers "
                              f"({num_layers})")
        if not (self.forward_reset and self.backward_reset):
            raise ConfigError("ResetBLSTMInsert needs forward_reset and backward_reset: the original repeats the "
                              "additional input over both directions' state replicas")
        c = combine_layer - 1
        for lstms in (self.forward_lstms, self.backward_lstms):
            lstms[c] = nn.LSTM(cast(nn.LSTM, lstms[c]).input_size + extra_dim, hidden, batch_first=True)
        self.combine_layer, self.extra_dim = combine_layer, extra_dim

    def forward(self, x: Tensor, extra: Tensor, seq_lengths: Tensor) -> Tensor:  # type: ignore[override]
        if extra.dim() != 2 or extra.shape[0] != x.shape[0]:
            from ..base.errors import BatchError

            raise BatchError(f"ResetBLSTMInsert: the additional input must be one vector per utterance [B, D], got "
                             f"{tuple(extra.shape)} for input {tuple(x.shape)}")
        region, x = rnn_precision(x)
        with region:
            return self._run(x, seq_lengths, extra.to(x.dtype) if extra.dtype in _HALF else extra, self.combine_layer - 1)


def _reverse(x: Tensor, lengths: Tensor) -> Tensor:
    """Each sequence's valid frames in reverse order (padded frames stay where they are)."""
    B, T = x.shape[:2]
    t = torch.arange(T, device=x.device)[None, :]
    index = torch.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)
    return x[torch.arange(B, device=x.device)[:, None], index]


def _reset_direction(lstm: nn.LSTM, xs: Tensor, t_reset: int, group: int,
                     reset: bool) -> tuple[Tensor, Tensor | None]:
    """(output ``[B, T, H]``, replica outputs ``[B, T, n, H]``) of one direction in its own time.

    Without ``reset`` a plain LSTM over ``xs`` ``[B, T, D]`` (no replicas). With it, replica ``k`` reads
    ``xs[:, :, k]`` of ``[B, T, n, D]``; its state restarts before frames ``phase_k + m * t_reset``
    (``phase_k = k * group + group - 1``), so each of its windows (the first ends before ``phase_k``)
    is one independent sequence: all of them run as one batch of ``t_reset``-frame sequences. Frames
    after a window's end (or past ``T``) only follow it, so the LSTM's causality keeps them out."""
    if not reset:
        return lstm(xs)[0], None
    B, T, n, D = xs.shape
    dev = xs.device
    k = torch.arange(n, device=dev)
    phase = k * group + group - 1  # [n]
    windows = -(-T // t_reset) + 1  # window 0 runs from frame 0 up to the first restart
    starts = (phase[:, None] + (torch.arange(windows, device=dev)[None, :] - 1) * t_reset).clamp(min=0)
    frames = (starts[..., None] + torch.arange(t_reset, device=dev)).clamp(max=T - 1)  # [n, windows, t_reset]
    batch = xs.transpose(1, 2)[:, k[:, None, None], frames]  # [B, n, windows, t_reset, D]
    out = lstm(batch.reshape(-1, t_reset, D))[0].reshape(B, n, windows, t_reset, -1)
    t = torch.arange(T, device=dev)[:, None]
    window = torch.div(t - phase, t_reset, rounding_mode="floor")  # [T, n]: -1 before the first restart
    position = t - (phase + window * t_reset).clamp(min=0)
    replicas = out[:, k[None, :], window + 1, position]  # [B, T, n, H]
    most = torch.div(t[:, 0] + 1, group, rounding_mode="floor") % n  # [T]: the replica with the most context
    return replicas[:, torch.arange(T, device=dev), most], replicas


def _ceil_div(a: Tensor, b: int) -> Tensor:
    return -torch.div(-a, b, rounding_mode="floor")


def _permute_replicas(acts: tuple[Tensor, Tensor], reps: tuple[Tensor | None, Tensor | None], lengths: Tensor,
                      t_reset: int, prev_t_reset: int, group: int, prev_group: int, forward_reset: bool,
                      backward_reset: bool, separate: bool) -> tuple[Tensor, Tensor]:
    """The next layer's (forward input, backward input) from the previous layer's outputs (original time
    order): replica ``k`` of the next layer, ``tau`` frames after its restart (``tau`` capped at the
    previous ``t_reset - 1``), reads the previous replicas that restarted ``tau`` frames before, in
    either direction's time (the original's ``permute_versions``, its index arithmetic as written)."""
    act_f, act_b = acts
    B, T, _ = act_f.shape
    n, prev_n = t_reset // group, prev_t_reset // prev_group
    dev = act_f.device
    t = torch.arange(T, device=dev)[None, :, None]  # [1, T, 1]
    back_t = lengths[:, None, None] - 1 - t  # [B, T, 1]: the backward direction's time
    k = torch.arange(n, device=dev)[None, None, :]
    tau_f = ((t - group * k) % t_reset).clamp(max=prev_t_reset - 1)
    tau_b = ((back_t - group * k) % t_reset).clamp(max=prev_t_reset - 1)

    def pick(rep: Tensor | None, time: Tensor, tau: Tensor) -> Tensor:
        assert rep is not None
        index = (_ceil_div(time - tau, prev_group) % prev_n).expand(B, T, n)
        return rep.gather(2, index[..., None].expand(B, T, n, rep.shape[-1]))

    def tiled(act: Tensor) -> Tensor:
        return act[:, :, None].expand(B, T, n, act.shape[-1])

    f_for_f = pick(reps[0], t, tau_f) if forward_reset else act_f
    b_for_b = pick(reps[1], back_t, tau_b) if backward_reset else act_b
    if forward_reset and backward_reset:
        b_for_f, f_for_b = pick(reps[1], back_t, tau_f), pick(reps[0], t, tau_b)
    elif forward_reset:
        b_for_f, f_for_b = tiled(act_b), act_f
    else:
        b_for_f, f_for_b = act_b, tiled(act_f)
    if separate:
        return f_for_f, b_for_b
    return torch.cat((f_for_f, b_for_f), dim=-1), torch.cat((f_for_b, b_for_b), dim=-1)


class LeakyBLSTM(nn.Module):
    """The original's leaky bidirectional LSTMs (``leaky_dblstm``, ``leaky_dblstm_notrec``,
    ``leaky_dblstm_iznotrec``) over padded ``[B, T, D]`` input; output ``[B, T, 2*hidden]``, zero on
    padded frames, which never change valid ones (the backward direction starts at each sequence's own
    last valid frame).

    Each direction steps the original's cell, gates in its order ``i, j, f, o``::

        n_t = sigmoid(f_t + forget_bias) * c_{t-1} + sigmoid(i_t) * tanh(j_t)
        h_t = tanh(n_t) * sigmoid(o_t)        # the output sees the state before the leak
        c_t = leak * n_t                      # the state the next frame reads

    ``leak = 1`` is a plain LSTM. ``recurrent`` names the gates that read ``h_{t-1}`` besides the
    input: ``"all"`` (``leaky_dblstm``), ``"forget_output"`` (``leaky_dblstm_iznotrec``: ``i`` and
    ``j`` read the input only) or ``"none"`` (``leaky_dblstm_notrec``: the cell state is the only
    recurrence). ``input_noise`` (Gaussian, on the input) and ``dropout`` (a drop probability, on the
    last layer's output only, as the original's) in training mode only.

    The input projections of every frame and both directions are one batched matmul per layer; then a
    loop over frames steps both directions together (only the gates that read ``h_{t-1}`` are left in
    it, so ``"none"`` loops over one multiply-add per frame)."""

    RECURRENT = {"all": 4, "forget_output": 2, "none": 0}  # how many of the gates (the last ones) read h_{t-1}

    def __init__(self, input_dim: int, hidden: int, num_layers: int = 1, leak: float = 1.0,
                 recurrent: str = "all", forget_bias: float = 1.0, input_noise: float = 0.0,
                 dropout: float = 0.0) -> None:
        super().__init__()
        if recurrent not in self.RECURRENT:
            from ..base.errors import ConfigError

            raise ConfigError(f"LeakyBLSTM recurrent = {recurrent!r}; valid: {list(self.RECURRENT)}")
        n = self.RECURRENT[recurrent]
        bound = hidden ** -0.5  # nn.LSTM's initialisation

        def param(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape).uniform_(-bound, bound))

        # per layer, both directions stacked on the first axis: [2, D_in, 4H], [2, 4H], [2, H, nH]
        dims = [input_dim] + [2 * hidden] * (num_layers - 1)
        self.input_weights = nn.ParameterList(param(2, d, 4 * hidden) for d in dims)
        self.biases = nn.ParameterList(param(2, 4 * hidden) for _ in dims)
        self.recurrent_weights = nn.ParameterList(param(2, hidden, n * hidden) for _ in dims) if n else None
        shift = torch.zeros(4 * hidden)
        shift[2 * hidden:3 * hidden] = forget_bias
        self.register_buffer("forget_shift", shift, persistent=False)
        self.hidden, self.num_layers, self.leak, self.recurrent = hidden, num_layers, float(leak), recurrent
        self.forget_bias, self.input_noise, self.dropout = float(forget_bias), input_noise, dropout
        self.output_dim = 2 * hidden

    def forward(self, x: Tensor, seq_lengths: Tensor) -> Tensor:
        if self.training and self.input_noise > 0:
            x = x + self.input_noise * torch.randn_like(x)
        B, T = x.shape[:2]
        lengths = seq_lengths.to(x.device)
        valid = (torch.arange(T, device=x.device)[None, :] < lengths[:, None])[..., None]  # [B, T, 1]
        out = x
        for layer in range(self.num_layers):
            both = torch.stack((out, _reverse(out, lengths)))  # [2, B, T, D]: each direction in its own time
            rows = both.transpose(1, 2).reshape(2, T * B, -1)
            bias = (self.biases[layer] + self.forget_shift)[:, None]
            gates = torch.baddbmm(bias, rows, self.input_weights[layer]).view(2, T, B, -1)
            w = self.recurrent_weights[layer] if self.recurrent_weights is not None else None
            hs = self._directions(gates, w)  # [2, T, B, H]
            fw, bw = hs.transpose(1, 2)
            out = torch.where(valid, torch.cat((fw, _reverse(bw, lengths)), dim=-1), 0.0)
        if self.training and self.dropout > 0:
            out = nn.functional.dropout(out, self.dropout)
        return out

    def _directions(self, gates: Tensor, w: Tensor | None) -> Tensor:
        """``h`` ``[2, T, B, H]`` of both directions from their input projections ``[2, T, B, 4H]``
        (forget bias included) and recurrent weights ``[2, H, nH]`` onto the last ``n`` gates."""
        H, leak = self.hidden, self.leak
        _, T, B, _ = gates.shape
        n_prev = gates.new_zeros(2, B, H)  # the un-leaked state of the previous frame
        if self.recurrent != "all":  # i and j read the input only: the candidate for every frame at once
            u = torch.sigmoid(gates[..., :H]) * torch.tanh(gates[..., H:2 * H])
        if w is None:
            forget = torch.sigmoid(gates[..., 2 * H:3 * H])
            states = []
            for t in range(T):
                n_prev = torch.addcmul(u[:, t], forget[:, t], n_prev, value=leak)
                states.append(n_prev)
            return torch.tanh(torch.stack(states, dim=1)) * torch.sigmoid(gates[..., 3 * H:])
        h = gates.new_zeros(2, B, H)
        hs = []
        for t in range(T):
            if self.recurrent == "all":
                z = torch.baddbmm(gates[:, t], h, w)
                s = torch.sigmoid(z)
                u_t = s[..., :H] * torch.tanh(z[..., H:2 * H])
                f, o = s[..., 2 * H:3 * H], s[..., 3 * H:]
            else:
                f, o = torch.sigmoid(torch.baddbmm(gates[:, t, :, 2 * H:], h, w)).chunk(2, dim=-1)
                u_t = u[:, t]
            n_prev = torch.addcmul(u_t, f, n_prev, value=leak)
            h = torch.tanh(n_prev) * o
            hs.append(h)
        return torch.stack(hs, dim=1)


class BRNN(nn.Module):
    """The original's ``dbrnn``: stacked bidirectional tanh RNN, ``h_t = tanh(W x_t + U h_{t-1} + b)``,
    over padded ``[B, T, D]`` input, honouring ``seq_lengths`` (packed sequences, as BLSTM). Output
    ``[B, T, 2*hidden]``, zero on padded frames. In training mode only: ``input_noise`` adds Gaussian
    noise to the input, ``layer_dropout`` drops after every layer, the last one included (the
    original's ``dropout``, a keep probability: ``1 - keep``)."""

    def __init__(self, input_dim: int, hidden: int, num_layers: int = 1, input_noise: float = 0.0,
                 layer_dropout: float = 0.0) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.RNN(input_dim if i == 0 else 2 * hidden, hidden, batch_first=True,
                                           bidirectional=True) for i in range(num_layers))
        self.input_noise, self.layer_dropout = input_noise, layer_dropout
        self.output_dim = 2 * hidden

    def forward(self, x: Tensor, seq_lengths: Tensor, host_lengths: Tensor | None = None) -> Tensor:
        if self.training and self.input_noise > 0:
            x = x + self.input_noise * torch.randn_like(x)
        packing = Packing(seq_lengths, host_lengths, x.device)
        region, out = rnn_precision(x)
        with region:
            for rnn in self.layers:
                packed = packing.pack(out)
                out, _ = rnn(packed)
                out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
                if self.layer_dropout > 0:
                    out = nn.functional.dropout(out, self.layer_dropout, self.training)
        return out
