"""The rotary embedding's Triton kernel, forward and backward (launch.py launches it).

One program owns BLOCK_S tokens of one sequence x BLOCK_D rotated pairs, for every head of q and
k, BLOCK_R // 2 heads of each side at a time. Tensors are [B, S, H, D] (tables [B, S, R]) with a
stride per axis; batch stride 0 for a batch of one (BATCHED off) or a table shared by the batch.
Per pair (x1, x2) and table pairs (c1, c2), (s1, s2): rotary_torch.py's forward and adjoint, and
    grad_cos = sum_h (g * x)          grad_sin = sum_h (g * (-x2, x1))
    grad_angles = cos * grad_sin - sin * grad_cos
A pair is (j, j + HALF) or (2j, 2j + 1) (INTERLEAVED) of the first 2*HALF channels, or the last
(LAST); the programs of the first pair block copy the others. PAIR_TABLE: one table value per pair
(channel j), its gradient summed over both members. The table gradient is summed over heads in
registers in a fixed order: deterministic. Offsets are int64.
"""

import triton
import triton.language as tl


@triton.jit
def _stride(seq_len, stride: tl.constexpr):
    """A stride constexpr as launch.encode_strides writes it: >= 0 is the stride, -a is a*seq_len."""
    if stride < 0:
        return tl.cast(seq_len, tl.int64) * (-stride)
    else:
        return stride


@triton.jit
def _pair_tile(
    ptr, stride_seq, stride_head, stride_dim, s, h, pid_d, seq_len, H: tl.constexpr, HALF: tl.constexpr,
    BLOCK_D: tl.constexpr, INTERLEAVED: tl.constexpr, PAIR_AXIS_FIRST: tl.constexpr,
):  # fmt: skip
    """Pointers and mask of BLOCK_D pairs of heads h ([1, BLOCK_H, 1]) of tokens s ([BLOCK_S, 1, 1]):
    [2, S, H, D] (PAIR_AXIS_FIRST) or [S, H, D, 2]; interleaved pairs are contiguous, so their tile
    is flat, [S, H, 2*D] (wide accesses), and is reshaped to [S, H, D, 2] once loaded."""
    # The heads' offset and mask come last: what precedes them is the same for every chunk of heads.
    if INTERLEAVED:
        c = pid_d * 2 * BLOCK_D + tl.arange(0, 2 * BLOCK_D)[None, None, :]
        ptrs = (ptr + s * stride_seq + c * stride_dim) + h * stride_head
        mask = (s < seq_len) & (c < 2 * HALF) & (h < H)
    else:
        j = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)[None, None, :]
        p = (ptr + s * stride_seq + j * stride_dim) + h * stride_head
        m = (s < seq_len) & (j < HALF) & (h < H)
        if PAIR_AXIS_FIRST:
            ptrs = p[None, :, :, :] + tl.arange(0, 2)[:, None, None, None] * (HALF * stride_dim)
            mask = m[None, :, :, :]
        else:
            ptrs = p[:, :, :, None] + tl.arange(0, 2)[None, None, None, :] * (HALF * stride_dim)
            mask = m[:, :, :, None]
    return ptrs, mask


@triton.jit
def _load_pairs(
    ptr, stride_seq, stride_head, stride_dim, s, h, pid_d, seq_len, H: tl.constexpr, HALF: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, INTERLEAVED: tl.constexpr,
    REGS_FIRST: tl.constexpr,
):  # fmt: skip
    """(x1, x2) [BLOCK_S, BLOCK_H, BLOCK_D] in float32. The pair axis goes where this Triton keeps
    it in each thread's registers (REGS_FIRST, see launch.py); elsewhere Triton would regroup every
    loaded tile through shared memory. One access for both halves also brings the 32-byte sectors
    two half rows share (bf16 head_dim 72: 72-byte halves) to the L2 once."""
    ptrs, m = _pair_tile(
        ptr, stride_seq, stride_head, stride_dim, s, h, pid_d, seq_len, H, HALF, BLOCK_D, INTERLEAVED, REGS_FIRST
    )
    x = tl.load(ptrs, mask=m, other=0.0).to(tl.float32)
    if INTERLEAVED:
        x = tl.reshape(x, (BLOCK_S, BLOCK_H, BLOCK_D, 2))
    elif REGS_FIRST:
        x = tl.permute(x, (1, 2, 3, 0))
    return tl.split(x)


@triton.jit
def _load_chunk(
    in_q_ptr, in_k_ptr, q_ptr, k_ptr, stride_in_q_seq, stride_in_q_head, stride_in_q_dim, stride_in_k_seq,
    stride_in_k_head, stride_in_k_dim, stride_q_seq, stride_q_head, stride_q_dim, stride_k_seq, stride_k_head,
    stride_k_dim, s, h, pid_d, seq_len, HQ: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, INTERLEAVED: tl.constexpr,
    REGS_FIRST: tl.constexpr, READ_Q: tl.constexpr, READ_K: tl.constexpr, GRAD_TABLE: tl.constexpr,
):  # fmt: skip
    """The pairs of heads h of both sides: the rotated inputs (xq, xk) and, for the table gradient,
    q and k (pq, pk); zeros for what is not read, which the compiler drops."""
    zero = tl.zeros((BLOCK_S, BLOCK_H, BLOCK_D), tl.float32)
    xq1, xq2, xk1, xk2, pq1, pq2, pk1, pk2 = zero, zero, zero, zero, zero, zero, zero, zero
    # q's side, then k's, each the rotated input before q or k.
    if READ_Q:
        xq1, xq2 = _load_pairs(in_q_ptr, stride_in_q_seq, stride_in_q_head, stride_in_q_dim, s, h, pid_d, seq_len,
                               HQ, HALF, BLOCK_S, BLOCK_H, BLOCK_D, INTERLEAVED, REGS_FIRST)  # fmt: skip
    if GRAD_TABLE:
        pq1, pq2 = _load_pairs(q_ptr, stride_q_seq, stride_q_head, stride_q_dim, s, h, pid_d, seq_len,
                               HQ, HALF, BLOCK_S, BLOCK_H, BLOCK_D, INTERLEAVED, REGS_FIRST)  # fmt: skip
    if READ_K:
        xk1, xk2 = _load_pairs(in_k_ptr, stride_in_k_seq, stride_in_k_head, stride_in_k_dim, s, h, pid_d, seq_len,
                               HK, HALF, BLOCK_S, BLOCK_H, BLOCK_D, INTERLEAVED, REGS_FIRST)  # fmt: skip
    if GRAD_TABLE:
        pk1, pk2 = _load_pairs(k_ptr, stride_k_seq, stride_k_head, stride_k_dim, s, h, pid_d, seq_len,
                               HK, HALF, BLOCK_S, BLOCK_H, BLOCK_D, INTERLEAVED, REGS_FIRST)  # fmt: skip
    return xq1, xq2, xk1, xk2, pq1, pq2, pk1, pk2


@triton.jit
def _store_pairs(
    ptr, stride_seq, stride_head, stride_dim, s, h, pid_d, seq_len, y1, y2, H: tl.constexpr, HALF: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, INTERLEAVED: tl.constexpr,
    ROW_STORE: tl.constexpr, REGS_FIRST: tl.constexpr,
):  # fmt: skip
    """Stores both elements of the pairs by one access. ROW_STORE puts the pair axis on the lanes, so
    that one instruction writes whole rows (where half rows share 32-byte sectors), at the cost of a
    register shuffle."""
    FIRST: tl.constexpr = ROW_STORE != REGS_FIRST
    y = tl.join(y1, y2).to(ptr.dtype.element_ty)
    if INTERLEAVED:
        y = tl.reshape(y, (BLOCK_S, BLOCK_H, 2 * BLOCK_D))
    elif FIRST:
        y = tl.permute(y, (3, 0, 1, 2))
    ptrs, m = _pair_tile(
        ptr, stride_seq, stride_head, stride_dim, s, h, pid_d, seq_len, H, HALF, BLOCK_D, INTERLEAVED, FIRST
    )
    tl.store(ptrs, y, mask=m)


@triton.jit
def _copy_tail(
    in_ptr, out_ptr, stride_in_seq, stride_in_head, stride_in_dim, stride_out_seq, stride_out_head, stride_out_dim, s,
    h, seq_len, H: tl.constexpr, START: tl.constexpr, TAIL: tl.constexpr, BLOCK_TAIL: tl.constexpr,
):  # fmt: skip
    """Channels START .. START + TAIL - 1 of heads h, which partial rotary passes through unchanged."""
    c = START + tl.arange(0, BLOCK_TAIL)[None, None, :]
    m = (s < seq_len) & (h < H) & (c < START + TAIL)
    x = tl.load(in_ptr + s * stride_in_seq + h * stride_in_head + c * stride_in_dim, mask=m)
    tl.store(
        out_ptr + s * stride_out_seq + h * stride_out_head + c * stride_out_dim, x.to(out_ptr.dtype.element_ty), mask=m
    )


@triton.jit
def _load_tables(table_ptr, sin_ptr, stride_table_seq, stride_table_dim, stride_sin_seq, stride_sin_dim, s, ch1,
                 ch2, mask, ANGLES: tl.constexpr, JOINED: tl.constexpr):  # fmt: skip
    """(t1, t2, n1, n2): the table, and sin unless ANGLES, at channels ch1 and ch2 of rows s
    ([BLOCK_S, BLOCK_D] each) in float32. JOINED: by one access (2-byte tables, which Triton
    regroups right after their load: one round trip to wait for, not four; cos/sin with an odd
    HALF); else one access per table and channel set, regrouped where used."""
    if JOINED:
        ch = tl.join(ch1, ch2)
        m = tl.join(mask, mask)
        t_ptrs = table_ptr + s[:, :, None] * stride_table_seq + ch * stride_table_dim
        if ANGLES:
            t1, t2 = tl.split(tl.load(t_ptrs, mask=m, other=0.0).to(tl.float32))
        else:
            n_ptrs = sin_ptr + s[:, :, None] * stride_sin_seq + ch * stride_sin_dim
            t, n = tl.split(tl.load(tl.join(t_ptrs, n_ptrs), mask=tl.join(m, m), other=0.0).to(tl.float32))
            t1, t2 = tl.split(t)
            n1, n2 = tl.split(n)
    else:
        t1 = tl.load(table_ptr + s * stride_table_seq + ch1 * stride_table_dim, mask=mask, other=0.0).to(tl.float32)
        t2 = tl.load(table_ptr + s * stride_table_seq + ch2 * stride_table_dim, mask=mask, other=0.0).to(tl.float32)
        if not ANGLES:
            n1 = tl.load(sin_ptr + s * stride_sin_seq + ch1 * stride_sin_dim, mask=mask, other=0.0).to(tl.float32)
            n2 = tl.load(sin_ptr + s * stride_sin_seq + ch2 * stride_sin_dim, mask=mask, other=0.0).to(tl.float32)
    if ANGLES:
        n1, n2 = t1, t2  # unused: the caller takes sin of the angles
    return t1, t2, n1, n2


@triton.jit(do_not_specialize=["seq_len"])
def rotary_kernel(
    # Rotated inputs [B, S, HQ, D], [B, S, HK, D]: q, k (forward) or grad_q_embed, grad_k_embed (backward); outputs
    # shaped as them: q_embed, k_embed or grad_q, grad_k; q and k (backward with the table gradient only); the table
    # [B, S, R]: the angles (ANGLES; sin_ptr unused) or cos, sin; and its gradient
    in_q_ptr, in_k_ptr, out_q_ptr, out_k_ptr, q_ptr, k_ptr, table_ptr, sin_ptr, grad_table_ptr, grad_sin_ptr, seq_len,
    # Batch strides, in elements (see _stride); all 0 for one sequence
    stride_in_q_batch: tl.constexpr, stride_in_k_batch: tl.constexpr, stride_out_q_batch: tl.constexpr,
    stride_out_k_batch: tl.constexpr, stride_q_batch: tl.constexpr, stride_k_batch: tl.constexpr,
    stride_table_batch: tl.constexpr, stride_sin_batch: tl.constexpr, stride_grad_table_batch: tl.constexpr,
    stride_grad_sin_batch: tl.constexpr,
    # Sizes: heads, rotated pairs per head (R / 2), channels past them (D - R) and their power of 2
    HQ: tl.constexpr, HK: tl.constexpr, HALF: tl.constexpr, TAIL: tl.constexpr, BLOCK_TAIL: tl.constexpr,
    # Strides, in elements (see _stride)
    stride_in_q_seq: tl.constexpr, stride_in_q_head: tl.constexpr, stride_in_q_dim: tl.constexpr,
    stride_in_k_seq: tl.constexpr, stride_in_k_head: tl.constexpr, stride_in_k_dim: tl.constexpr,
    stride_out_q_seq: tl.constexpr, stride_out_q_head: tl.constexpr, stride_out_q_dim: tl.constexpr,
    stride_out_k_seq: tl.constexpr, stride_out_k_head: tl.constexpr, stride_out_k_dim: tl.constexpr,
    stride_q_seq: tl.constexpr, stride_q_head: tl.constexpr, stride_q_dim: tl.constexpr,
    stride_k_seq: tl.constexpr, stride_k_head: tl.constexpr, stride_k_dim: tl.constexpr,
    stride_table_seq: tl.constexpr, stride_table_dim: tl.constexpr, stride_sin_seq: tl.constexpr,
    stride_sin_dim: tl.constexpr, stride_grad_table_seq: tl.constexpr, stride_grad_table_dim: tl.constexpr,
    stride_grad_sin_seq: tl.constexpr, stride_grad_sin_dim: tl.constexpr,
    # Tiling: tokens and pairs per program, heads per chunk (q's and k's together)
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
    # What the call computes: the adjoint rotation (backward), angles in the table, interleaved pairs, a table value
    # per pair, the last channels rotated, which outputs; several sequences (a batch stride is not 0); code generation
    ADJOINT: tl.constexpr, ANGLES: tl.constexpr, INTERLEAVED: tl.constexpr, PAIR_TABLE: tl.constexpr,
    LAST: tl.constexpr, WRITE_Q: tl.constexpr, WRITE_K: tl.constexpr, GRAD_TABLE: tl.constexpr,
    BATCHED: tl.constexpr, ROW_STORE: tl.constexpr, REGS_FIRST: tl.constexpr,
):  # fmt: skip
    BLOCK_H: tl.constexpr = BLOCK_R // 2
    # A side is read when it is written or summed for the table gradient.
    READ_Q: tl.constexpr = WRITE_Q or GRAD_TABLE
    READ_K: tl.constexpr = WRITE_K or GRAD_TABLE
    # Strides other than the tokens' may be multiples of seq_len (sdpa's [1, H, S, D] gradient).
    stride_in_q_head, stride_in_q_dim = _stride(seq_len, stride_in_q_head), _stride(seq_len, stride_in_q_dim)
    stride_in_k_head, stride_in_k_dim = _stride(seq_len, stride_in_k_head), _stride(seq_len, stride_in_k_dim)
    stride_out_q_head, stride_out_q_dim = _stride(seq_len, stride_out_q_head), _stride(seq_len, stride_out_q_dim)
    stride_out_k_head, stride_out_k_dim = _stride(seq_len, stride_out_k_head), _stride(seq_len, stride_out_k_dim)
    stride_q_head, stride_q_dim = _stride(seq_len, stride_q_head), _stride(seq_len, stride_q_dim)
    stride_k_head, stride_k_dim = _stride(seq_len, stride_k_head), _stride(seq_len, stride_k_dim)
    stride_table_dim, stride_sin_dim = _stride(seq_len, stride_table_dim), _stride(seq_len, stride_sin_dim)
    stride_grad_table_dim = _stride(seq_len, stride_grad_table_dim)
    stride_grad_sin_dim = _stride(seq_len, stride_grad_sin_dim)

    if LAST:  # the rotated channels start past the TAIL that passes through (at -TAIL from here)
        in_q_ptr, in_k_ptr = in_q_ptr + TAIL * stride_in_q_dim, in_k_ptr + TAIL * stride_in_k_dim
        out_q_ptr, out_k_ptr = out_q_ptr + TAIL * stride_out_q_dim, out_k_ptr + TAIL * stride_out_k_dim
        q_ptr, k_ptr = q_ptr + TAIL * stride_q_dim, k_ptr + TAIL * stride_k_dim
    pid_s = tl.program_id(0)
    if BATCHED:  # programs 0 .. B * cdiv(S, BLOCK_S) - 1: the batch's sequences one after the other
        n_tiles = tl.cdiv(seq_len, BLOCK_S)
        b = pid_s // n_tiles
        pid_s -= b * n_tiles
        b = b.to(tl.int64)
        in_q_ptr += b * _stride(seq_len, stride_in_q_batch)
        in_k_ptr += b * _stride(seq_len, stride_in_k_batch)
        out_q_ptr += b * _stride(seq_len, stride_out_q_batch)
        out_k_ptr += b * _stride(seq_len, stride_out_k_batch)
        q_ptr, k_ptr = q_ptr + b * _stride(seq_len, stride_q_batch), k_ptr + b * _stride(seq_len, stride_k_batch)
        table_ptr += b * _stride(seq_len, stride_table_batch)
        sin_ptr += b * _stride(seq_len, stride_sin_batch)
        grad_table_ptr += b * _stride(seq_len, stride_grad_table_batch)
        grad_sin_ptr += b * _stride(seq_len, stride_grad_sin_batch)
    pid_d = tl.program_id(1)
    s = pid_s.to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S)
    j = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    mask_sj = (s[:, None] < seq_len) & (j[None, :] < HALF)
    if PAIR_TABLE:  # the channels of the pairs' elements in a table row
        ch1 = j[None, :]
        ch2 = ch1
    elif INTERLEAVED:
        ch1 = 2 * j[None, :]
        ch2 = ch1 + 1
    else:
        ch1 = j[None, :]
        ch2 = ch1 + HALF
    s2, s3 = s[:, None], s[:, None, None]

    # The table and the first chunk of heads are loaded in the order that leaves a program one DRAM
    # round trip to wait for: 4-byte tables first, by separate loads (cos and sin of angles then
    # overlap the chunk's loads), but for cos/sin with an odd HALF, whose second halves take scalar
    # accesses; those and 2-byte tables after the chunk, by one load (Triton regroups 2-byte tables
    # right after their load, which then waits).
    TABLE_FIRST: tl.constexpr = table_ptr.dtype.element_ty.primitive_bitwidth > 16 and (ANGLES or HALF % 2 == 0)
    if TABLE_FIRST:
        t1, t2, n1, n2 = _load_tables(table_ptr, sin_ptr, stride_table_seq, stride_table_dim, stride_sin_seq,
                                      stride_sin_dim, s2, ch1, ch2, mask_sj, ANGLES, False)  # fmt: skip
    h = tl.arange(0, BLOCK_H)[None, :, None]
    xq1, xq2, xk1, xk2, pq1, pq2, pk1, pk2 = _load_chunk(
        in_q_ptr, in_k_ptr, q_ptr, k_ptr, stride_in_q_seq, stride_in_q_head, stride_in_q_dim, stride_in_k_seq,
        stride_in_k_head, stride_in_k_dim, stride_q_seq, stride_q_head, stride_q_dim, stride_k_seq, stride_k_head,
        stride_k_dim, s3, h, pid_d, seq_len, HQ, HK, HALF, BLOCK_S, BLOCK_H, BLOCK_D, INTERLEAVED, REGS_FIRST,
        READ_Q, READ_K, GRAD_TABLE)  # fmt: skip
    if not TABLE_FIRST:
        t1, t2, n1, n2 = _load_tables(table_ptr, sin_ptr, stride_table_seq, stride_table_dim, stride_sin_seq,
                                      stride_sin_dim, s2, ch1, ch2, mask_sj, ANGLES, True)  # fmt: skip
    if ANGLES:  # once per token row, for all the heads
        c1, c2, n1, n2 = tl.cos(t1), tl.cos(t2), tl.sin(t1), tl.sin(t2)
    else:
        c1, c2 = t1, t2
    # y1 = x1*c1 + x2*a, y2 = x2*c2 + x1*b: the adjoint swaps which sine goes where.
    if ADJOINT:
        a, b = n2[:, None, :], -n1[:, None, :]
    else:
        a, b = -n1[:, None, :], n2[:, None, :]
    c1b, c2b = c1[:, None, :], c2[:, None, :]

    gc1, gc2 = tl.zeros((BLOCK_S, BLOCK_D), tl.float32), tl.zeros((BLOCK_S, BLOCK_D), tl.float32)
    gs1, gs2 = tl.zeros((BLOCK_S, BLOCK_D), tl.float32), tl.zeros((BLOCK_S, BLOCK_D), tl.float32)
    for h0 in range(0, HQ if HQ > HK else HK, BLOCK_H):
        h = (h0 + tl.arange(0, BLOCK_H))[None, :, None]
        if h0 > 0:  # every load of a chunk, both sides', before any store (which may alias them)
            xq1, xq2, xk1, xk2, pq1, pq2, pk1, pk2 = _load_chunk(
                in_q_ptr, in_k_ptr, q_ptr, k_ptr, stride_in_q_seq, stride_in_q_head, stride_in_q_dim,
                stride_in_k_seq, stride_in_k_head, stride_in_k_dim, stride_q_seq, stride_q_head, stride_q_dim,
                stride_k_seq, stride_k_head, stride_k_dim, s3, h, pid_d, seq_len, HQ, HK, HALF, BLOCK_S, BLOCK_H,
                BLOCK_D, INTERLEAVED, REGS_FIRST, READ_Q, READ_K, GRAD_TABLE)  # fmt: skip
        if GRAD_TABLE:
            # One reduction per quantity over both sides (masked heads hold zeros).
            gc1 += tl.sum(xq1 * pq1 + xk1 * pk1, axis=1)
            gc2 += tl.sum(xq2 * pq2 + xk2 * pk2, axis=1)
            gs1 -= tl.sum(xq1 * pq2 + xk1 * pk2, axis=1)
            gs2 += tl.sum(xq2 * pq1 + xk2 * pk1, axis=1)
        if WRITE_Q:
            _store_pairs(out_q_ptr, stride_out_q_seq, stride_out_q_head, stride_out_q_dim, s3, h, pid_d, seq_len,
                         xq1 * c1b + xq2 * a, xq2 * c2b + xq1 * b,
                         HQ, HALF, BLOCK_S, BLOCK_H, BLOCK_D, INTERLEAVED, ROW_STORE, REGS_FIRST)  # fmt: skip
        if WRITE_K:
            _store_pairs(out_k_ptr, stride_out_k_seq, stride_out_k_head, stride_out_k_dim, s3, h, pid_d, seq_len,
                         xk1 * c1b + xk2 * a, xk2 * c2b + xk1 * b,
                         HK, HALF, BLOCK_S, BLOCK_H, BLOCK_D, INTERLEAVED, ROW_STORE, REGS_FIRST)  # fmt: skip
        if BLOCK_TAIL > 0:
            if pid_d == 0:
                if WRITE_Q:
                    _copy_tail(in_q_ptr, out_q_ptr, stride_in_q_seq, stride_in_q_head, stride_in_q_dim,
                               stride_out_q_seq, stride_out_q_head, stride_out_q_dim, s3, h, seq_len,
                               HQ, -TAIL if LAST else 2 * HALF, TAIL, BLOCK_TAIL)  # fmt: skip
                if WRITE_K:
                    _copy_tail(in_k_ptr, out_k_ptr, stride_in_k_seq, stride_in_k_head, stride_in_k_dim,
                               stride_out_k_seq, stride_out_k_head, stride_out_k_dim, s3, h, seq_len,
                               HK, -TAIL if LAST else 2 * HALF, TAIL, BLOCK_TAIL)  # fmt: skip

    if GRAD_TABLE:
        g1 = grad_table_ptr + s2 * stride_grad_table_seq
        if ANGLES:  # d/dangle (cos, sin) = (-sin, cos)
            gt1, gt2 = c1 * gs1 - n1 * gc1, c2 * gs2 - n2 * gc2
        else:
            gt1, gt2 = gc1, gc2
            g2 = grad_sin_ptr + s2 * stride_grad_sin_seq
            if PAIR_TABLE:
                tl.store(g2 + ch1 * stride_grad_sin_dim, (gs1 + gs2).to(grad_sin_ptr.dtype.element_ty), mask=mask_sj)
            else:
                tl.store(g2 + ch1 * stride_grad_sin_dim, gs1.to(grad_sin_ptr.dtype.element_ty), mask=mask_sj)
                tl.store(g2 + ch2 * stride_grad_sin_dim, gs2.to(grad_sin_ptr.dtype.element_ty), mask=mask_sj)
        if PAIR_TABLE:
            tl.store(g1 + ch1 * stride_grad_table_dim, (gt1 + gt2).to(grad_table_ptr.dtype.element_ty), mask=mask_sj)
        else:
            tl.store(g1 + ch1 * stride_grad_table_dim, gt1.to(grad_table_ptr.dtype.element_ty), mask=mask_sj)
            tl.store(g1 + ch2 * stride_grad_table_dim, gt2.to(grad_table_ptr.dtype.element_ty), mask=mask_sj)
