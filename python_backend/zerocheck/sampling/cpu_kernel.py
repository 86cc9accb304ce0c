"""Compiled CPU kernel (numba) of the zero-check sampler: every row of a batch in one parallel call.

A row's group maxima (`ops.group_max`'s values: GROUP tokens a group), taken in the row's own thread by
one vectorised pass that leaves the row in that core's cache for the rest of its work, steer the per-row
work, so no row is sorted and only dense rows exponentiate every token:
- greedy rows: the first group holding the row's largest value, then the first such token in it;
- top-k rows: the (k+1)-th largest group maximum t bounds the (k+1)-th largest value from below (the
  k+1 groups above it hold k+1 distinct tokens >= t), so the candidates are the tokens >= t of the
  groups whose maximum is >= t: every token >= the k-th value, ties included, from about k+1 groups.
  Then, as `ops.draw_from_candidates`: temperature, top-p on the float64 cumulative mass, min-p and
  the exponential race;
- dense rows (no top-k): y = (x - max) / T and w = exp(y) a group at a time (a vectorised exp, within
  2 ulp of float32's), the group masses above min-p, then the two-stage race of `ops.race_draw_dense`
  (groups by their mass, then the members of the winning group). Without min-p, only the groups that
  bounds from their maxima leave in contention are summed (the race's winner is the same). With top-p
  the race's token is a proposal, kept when it lies in the nucleus (`ops.in_nucleus`: one exp pass
  sums the row's mass and the mass above the token); a rejected row (probability <= 1 - top_p) takes
  the mass histogram and exact crossing token of `ops.dense_top_p_threshold` (w kept, so the masses
  above it need no second exp) and a second race over the nucleus with independent noise.
The noise is `noise.exponential_noise`'s, keyed by the same (row key, counter), so a row gets the
token the eager torch path gives (up to float32 rounding of exp and of the order of the sums).

Compiled by `warm_up` when a compiled sampler is made (cached on disk when the package directory is
writable); `available()` says whether numba is importable. The choice of kernel or eager torch is made
once, by `make_sampler`.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from zerocheck.jit import EXP_FLOOR, available, exp_parts, numba  # noqa: F401  (available: the kernel runs)

from .batch import GREEDY_ROW, TOP_K_ROW, SamplingBatch, build_batch
from .ops import GROUP, GROUP_SALT, HIST_BUCKETS, HIST_RANGE, TOP_P_RETRY_SALT
from .params import SamplingParams

# rows are spread over numba's threads (OpenMP, zerocheck.jit) in batches of at least PARALLEL_ROWS rows or
# with at least PARALLEL_TOP_P_ROWS dense top-p rows (the heaviest rows: several passes over the vocabulary
# each); lighter batches run in the calling thread, where the hand-off to the threads would cost more than it
# saves (benchmarks/sampler.py times both)
PARALLEL_ROWS = 8
PARALLEL_TOP_P_ROWS = 2
INSERTED_CANDIDATES = 256  # top-k candidates up to this many are sorted by insertion as they are found
_M32 = 0xFFFFFFFF
_MUL = 0x45D9F3B
_INV_2_32 = 1.0 / 4294967296.0
_F = np.float32
_BUCKET_SCALE = _F(-HIST_BUCKETS / HIST_RANGE)
_MAGNITUDE, _INF_BITS, _NAN_BITS = np.int32(0x7FFFFFFF), np.int32(0x7F800000), np.int32(0x7FC00000)
_SIGN = np.int32(-0x80000000)
# relative slack on a group's mass bounds: the exp's error (3e-7) plus float32 rounding of GROUP terms (8e-6)
MASS_BOUND = 1e-4

def _mix32(z):
    z = (((z >> 16) ^ z) * _MUL) & _M32
    z = (((z >> 16) ^ z) * _MUL) & _M32
    return (z >> 16) ^ z


def _noise_word(key0, key1, counter):
    """The 32-bit word of `noise.exponential_noise` for one (row key, counter): u = (word + 0.5) / 2**32."""
    z = _mix32(_mix32(key0 ^ (counter & _M32)) ^ key1)
    return _mix32(z ^ (counter >> 32))


def _exp_noise(key0, key1, counter):
    """E = -log(u) ~ Exp(1): `noise.exponential_noise` for one (row key, counter)."""
    return -math.log((np.float64(_noise_word(key0, key1, counter)) + 0.5) * _INV_2_32)


def _bucket(y):
    """y's bucket of the top-p mass histogram (`ops.dense_top_p_threshold`'s)."""
    return np.int32(min(max(y * _BUCKET_SCALE, _F(0.0)), _F(HIST_BUCKETS - 1)))


def _group_exp_parts(row, start, n, top, inv_t, lower, w, bits):
    """`exp_parts` of y = (row - top) * inv_t for the n tokens from start: w[i] * 2**k (bits[i] holds 2**k's
    float32 bits) is exp(y), w[i] = 0 at or below EXP_FLOOR and below lower. Vectorises; the caller multiplies
    by bits.view(float32) in its own loop, with its sums (one pass over w fewer than a separate multiply)."""
    for i in range(n):
        y = (row[start + i] - top) * inv_t
        z = y if y > EXP_FLOOR else EXP_FLOOR
        p, bits[i] = exp_parts(z)
        w[i] = p if y > EXP_FLOOR and y >= lower else _F(0.0)


def _group_masses(row, gmax, top, inv_t, lower, mass, hist, only, weights):
    """mass[g] = the float32 sum of w = exp(y) over group g's tokens with y >= lower, y = (row - top) *
    inv_t (w = 0 below EXP_FLOOR); groups whose maximum is below lower, and when `only` (bool per
    group) is not empty the groups it leaves out, get 0 without a pass over their tokens. With a histogram
    (hist.shape[0] == HIST_BUCKETS) the same pass adds each w to hist[y's bucket] for top-p; with weights
    (the row's length, else empty) it keeps each w there (`_stored_masses` then needs no second exp).
    exp: `zerocheck.jit.exp_parts` (within 2 ulp of float32's exp); the loops vectorise (compiled with
    reassociation and FMA contraction, no NaN/inf assumptions)."""
    vocab = row.shape[0]
    w = np.empty(GROUP, np.float32)
    bits = np.empty(GROUP, np.int32)
    scale = bits.view(np.float32)
    buckets = np.empty(GROUP, np.int32)
    histogram = hist.shape[0] == HIST_BUCKETS
    for g in range(mass.shape[0]):
        if (gmax[g] - top) * inv_t < lower or (only.shape[0] and not only[g]):
            mass[g] = _F(0.0)
            continue
        start = g * GROUP
        n = min(GROUP, vocab - start)
        _group_exp_parts(row, start, n, top, inv_t, lower, w, bits)
        total = _F(0.0)
        for i in range(n):
            w[i] *= scale[i]
            total += w[i]
        mass[g] = total
        if weights.shape[0]:
            for i in range(n):
                weights[start + i] = w[i]
        if histogram:
            for i in range(n):
                buckets[i] = _bucket((row[start + i] - top) * inv_t)
            for i in range(n):
                hist[buckets[i]] += w[i]


def _stored_masses(row, gmax, top, inv_t, lower, weights, mass):
    """`_group_masses`' masses from the weights it kept: mass[g] = the float32 sum of weights over group g's
    tokens with y >= lower (groups whose maximum is below lower: 0). A vectorised pass without exp: a top-p
    row's second pass reads the kept weights instead of computing exp again."""
    vocab = row.shape[0]
    for g in range(mass.shape[0]):
        if (gmax[g] - top) * inv_t < lower:
            mass[g] = _F(0.0)
            continue
        start = g * GROUP
        total = _F(0.0)
        for i in range(min(GROUP, vocab - start)):
            total += weights[start + i] if (row[start + i] - top) * inv_t >= lower else _F(0.0)
        mass[g] = total


def _contending_groups(gmax, top, inv_t, vocab, key0, key1):
    """The groups that can win a race over unmasked groups (bool per group), from bounds alone: a group's
    mass M lies in [w, n * w] (w = exp(its maximum's y), n its tokens; widened by MASS_BOUND for float32
    rounding), so its score E / M lies in [E / (n w), E / w]; a group whose lowest score is above the
    smallest highest score cannot have the smallest score. Groups with no weight (y of the maximum at or
    below EXP_FLOOR) never contend.

    The exact scores (a log and an exp each) are computed for few groups: the group holding the row's
    maximum (w = 1) bounds the smallest highest score by U = E_top / (1 - MASS_BOUND), so a group contends
    only if E <= U n w (1 + MASS_BOUND) <= c = U GROUP w (1 + MASS_BOUND); and E = -log(u) >= 1 - u for its
    uniform u. A first loop (vectorised: the hash, a float32 exp, no log) keeps the groups with 1 - u <= 2 c
    (the factor 2 covers float32 rounding); the others have E > c and cannot contend, and cannot hold the
    smallest highest score either (theirs is above U)."""
    groups = gmax.shape[0]
    first = 0
    while gmax[first] != top:
        first += 1
    log_bound = _F(math.log(_exp_noise(key0, key1, first + GROUP_SALT) * GROUP * 2.0 * (1.0 + MASS_BOUND)
                            / (1.0 - MASS_BOUND)))
    c = np.empty(groups, np.float32)
    bits = np.empty(groups, np.int32)
    scale = bits.view(np.float32)
    for g in range(groups):  # c[g] = 2 c of group g (0 when its y is at or below EXP_FLOOR)
        y = (gmax[g] - top) * inv_t
        z = min(max(y + log_bound, EXP_FLOOR), _F(87.0))
        p, bits[g] = exp_parts(z)
        c[g] = p if y > EXP_FLOOR else _F(0.0)
    maybe = np.empty(groups, np.bool_)
    for g in range(groups):
        rest = (_F(_M32 - _noise_word(key0, key1, g + GROUP_SALT)) + _F(0.5)) * _F(_INV_2_32)  # 1 - u (float32)
        maybe[g] = rest <= c[g] * scale[g]
    maybe[first] = True
    lowest = np.full(groups, np.inf)
    least_highest = np.inf
    for g in np.nonzero(maybe)[0]:
        y = (gmax[g] - top) * inv_t
        if y > EXP_FLOOR:
            noise = _exp_noise(key0, key1, g + GROUP_SALT)
            w = math.exp(np.float64(y))
            least_highest = min(least_highest, noise / (w * (1.0 - MASS_BOUND)))
            lowest[g] = noise / (min(GROUP, vocab - g * GROUP) * w * (1.0 + MASS_BOUND))
    return lowest <= least_highest


def _group_maxima(row, gm):
    """gm[g] = the largest value of row's group g (NaN when the group holds NaN), as `ops.group_max`; returns
    (the first group holding the row's largest value, whether the row holds NaN). On int32 keys ordered as
    the floats (a float's bits when its sign is clear, minus its magnitude bits when set: -0.0 and +0.0 are
    one key): a float max reduction with NaN checks does not vectorise, an int32 one does (the casts keep
    numba's int64 promotion out of the lanes)."""
    vocab = row.shape[0]
    bits = row.view(np.int32)
    out = gm.view(np.int32)
    best, best_key, nan = 0, np.int32(-_MAGNITUDE), False
    for g in range(gm.shape[0]):
        start = g * GROUP
        top = np.int32(-_MAGNITUDE)
        magnitude = np.int32(0)  # the largest magnitude: above +inf's, the group holds NaN
        for i in range(min(GROUP, vocab - start)):
            b = bits[start + i]
            m = np.int32(b & _MAGNITUDE)
            key = b if b >= np.int32(0) else np.int32(-m)
            top = key if key > top else top
            magnitude = m if m > magnitude else magnitude
        if magnitude > _INF_BITS:
            out[g], nan = _NAN_BITS, True
        else:
            out[g] = top if top >= np.int32(0) else np.int32(np.int32(-top) | _SIGN)
            if top > best_key:
                best, best_key = g, top
    return best, nan


def _largest(values, count):
    """The count-th largest of values (-inf when there are fewer), by a small sorted list."""
    best = np.full(count, -np.inf, np.float32)
    for v in values:
        if v > best[count - 1]:
            j = count - 1
            while j > 0 and best[j - 1] < v:
                best[j] = best[j - 1]
                j -= 1
            best[j] = v
    return best[count - 1]


def _candidates(row, gmax, low):
    """Tokens of row with value >= low (and > -inf) in the groups whose maximum is >= low, sorted by
    value descending, ids ascending among equal values: (values float32, ids int64). A first pass counts
    each group's hits (vectorised); the second reads a group only up to its last hit and inserts each hit
    into the sorted output (about k + 1 hits, one a group); more than INSERTED_CANDIDATES (ties at low) are
    sorted by a stable argsort instead (a few insertions cost less than a sort)."""
    vocab = row.shape[0]
    hits = np.zeros(gmax.shape[0], np.int32)
    count = 0
    for g in range(gmax.shape[0]):
        if gmax[g] >= low:
            start = g * GROUP
            found = np.int32(0)
            for i in range(min(GROUP, vocab - start)):  # an int32 count of a compare: this loop vectorises
                found += np.int32((row[start + i] >= low) & (row[start + i] > -np.inf))
            hits[g] = found
            count += found
    vals = np.empty(count, np.float32)
    ids = np.empty(count, np.int64)
    insert = count <= INSERTED_CANDIDATES
    n = 0
    for g in range(gmax.shape[0]):
        i, left = g * GROUP, hits[g]
        while left:
            v = row[i]
            if v >= low and v > -np.inf:
                j = n
                while insert and j > 0 and vals[j - 1] < v:  # past the equal values: ids ascending among them
                    vals[j], ids[j] = vals[j - 1], ids[j - 1]
                    j -= 1
                vals[j], ids[j] = v, i
                n += 1
                left -= 1
            i += 1
    if insert:
        return vals, ids
    order = np.argsort(-vals, kind="mergesort")
    return vals[order], ids[order]


def _draw_greedy(row, best, top):
    """The first token holding the row's largest value top: the first of group best (the first group holding it)."""
    token = best * GROUP
    while row[token] != top:
        token += 1
    return token


def _draw_top_k(row, gmax, k, t, top_p, min_p_log, key0, key1):
    """A top-k row's token (see the module docstring); -1 when it has no finite value."""
    vals, ids = _candidates(row, gmax, _largest(gmax, k + 1))
    width = vals.shape[0]
    if width == 0:
        return -1
    kth = vals[min(k, width) - 1]
    keep = min(k, width)
    if math.isfinite(kth):
        while keep < width and vals[keep] == kth:  # every token >= the k-th value, as the checked chain
            keep += 1
    y = np.empty(keep, np.float32)
    cum = np.empty(keep, np.float64)
    total = 0.0
    for i in range(keep):
        y[i] = (vals[i] - vals[0]) / t
        if math.isfinite(vals[i]):
            total += math.exp(np.float64(y[i]))
        cum[i] = total
    low = min_p_log
    if top_p < 1.0:
        target = np.float64(top_p) * total
        cut = 0
        while cut < keep - 1 and cum[cut] < target:
            cut += 1
        low = max(low, y[cut])
    best, arg = -np.inf, ids[0]
    for i in range(keep):
        if math.isfinite(vals[i]) and y[i] >= low:
            score = np.float64(y[i]) - math.log(_exp_noise(key0, key1, ids[i]))
            if score > best:
                best, arg = score, ids[i]
    return arg


def _top_p_threshold(row, gmax, top, inv_t, top_p, hist):
    """`ops.dense_top_p_threshold` for one row, from its mass histogram hist over y's buckets: the
    bucket where top_p of the mass is crossed, then the crossing token among its members. Bucket b
    holds -(b + 1) / s < y <= -b / s (s = HIST_BUCKETS / HIST_RANGE, a power of two: y * -s is exact),
    so members are found by two vectorised compares, in the groups whose maximum reaches the bucket."""
    vocab = row.shape[0]
    cum = np.cumsum(hist.astype(np.float64))
    target = np.float64(top_p) * cum[-1]
    boundary = min(np.searchsorted(cum, target), HIST_BUCKETS - 1)
    before = cum[boundary - 1] if boundary > 0 else 0.0
    high = _F(np.inf) if boundary == 0 else _F(boundary) / _BUCKET_SCALE
    low = _F(-np.inf) if boundary == HIST_BUCKETS - 1 else _F(boundary + 1) / _BUCKET_SCALE
    hits = np.zeros(gmax.shape[0], np.int64)
    for g in range(gmax.shape[0]):
        if (gmax[g] - top) * inv_t > low:
            count = np.int32(0)
            start = g * GROUP
            for i in range(min(GROUP, vocab - start)):  # an int32 count of a select: this loop vectorises
                y = (row[start + i] - top) * inv_t
                count += np.int32(1) if y > low and y <= high else np.int32(0)
            hits[g] = count
    count = hits.sum()
    if count == 0:
        return _F(-np.inf)
    members = np.empty(count, np.float32)
    n = 0
    for g in np.nonzero(hits)[0]:
        for i in range(g * GROUP, min(vocab, (g + 1) * GROUP)):
            y = (row[i] - top) * inv_t
            if y > low and y <= high:
                members[n] = y
                n += 1
    members = np.sort(members)[::-1]
    running = before
    for i in range(count):
        running += math.exp(np.float64(members[i]))
        if running >= target:
            return members[i]
    return members[count - 1]


def _nucleus_masses(row, gmax, top, inv_t, level):
    """(total, above): the float64 sums of w = exp(y) over the row and over its tokens with y > level (w = 0 at
    or below EXP_FLOOR), from float32 sums a group at a time: one vectorised exp pass, no stores."""
    vocab = row.shape[0]
    w = np.empty(GROUP, np.float32)
    bits = np.empty(GROUP, np.int32)
    scale = bits.view(np.float32)
    total, above = 0.0, 0.0
    for g in range(gmax.shape[0]):
        if (gmax[g] - top) * inv_t <= EXP_FLOOR:
            continue
        start = g * GROUP
        n = min(GROUP, vocab - start)
        _group_exp_parts(row, start, n, top, inv_t, _F(-np.inf), w, bits)
        group_total, group_above = _F(0.0), _F(0.0)
        for i in range(n):
            w[i] *= scale[i]
            group_total += w[i]
            group_above += w[i] if (row[start + i] - top) * inv_t > level else _F(0.0)
        total += np.float64(group_total)
        above += np.float64(group_above)
    return total, above


def _race(row, top, inv_t, lower, mass, key0, key1, salt):
    """The two-stage race: the groups by their masses `mass` (0: out of the race), then the winning group's
    tokens with y >= lower by their log-weights y (no exp needed); noise counters offset by salt."""
    vocab = row.shape[0]
    best, winner = np.inf, 0
    for g in range(mass.shape[0]):
        if mass[g] > 0.0:
            score = _exp_noise(key0, key1, g + GROUP_SALT + salt) / np.float64(mass[g])
            if score < best:
                best, winner = score, g
    top_score, arg = -np.inf, winner * GROUP
    for i in range(winner * GROUP, min(vocab, (winner + 1) * GROUP)):
        y = (row[i] - top) * inv_t
        if y > EXP_FLOOR and y >= lower:
            score = np.float64(y) - math.log(_exp_noise(key0, key1, i + salt))
            if score > top_score:
                top_score, arg = score, i
    return arg


def _draw_dense(row, gmax, top, inv_t, top_p, min_p_log, key0, key1, weights):
    """A dense row's token (see the module docstring); top: the row's finite max; weights: scratch of the row's
    length for a top-p row whose proposal is rejected (its w, kept between the two passes)."""
    groups = gmax.shape[0]
    mass = np.empty(groups, np.float32)
    every = np.empty(0, np.bool_)
    none = np.empty(0, np.float32)
    if min_p_log > -np.inf:
        _group_masses(row, gmax, top, inv_t, min_p_log, mass, none, every, none)
    else:  # the masses of the groups that can still win
        _group_masses(row, gmax, top, inv_t, min_p_log, mass, none,
                      _contending_groups(gmax, top, inv_t, row.shape[0], key0, key1), none)
    token = _race(row, top, inv_t, min_p_log, mass, key0, key1, 0)
    if top_p >= 1.0:
        return token
    total, above = _nucleus_masses(row, gmax, top, inv_t, (row[token] - top) * inv_t)
    if above < np.float64(top_p) * total:  # the proposal lies in the nucleus: kept
        return token
    hist = np.zeros(HIST_BUCKETS, np.float32)
    _group_masses(row, gmax, top, inv_t, _F(-np.inf), mass, hist, every, weights)
    lower = max(_top_p_threshold(row, gmax, top, inv_t, top_p, hist), min_p_log)
    if lower > -np.inf:
        _stored_masses(row, gmax, top, inv_t, lower, weights, mass)
    return _race(row, top, inv_t, lower, mass, key0, key1, TOP_P_RETRY_SALT)


def _draw_row(r, x, gmax, kind, top_k, temperature, top_p, min_p, keys, tokens, row_max, weights):
    """Row r: its group maxima into gmax[r], then tokens[r] and row_max[r] (NaN, token -1, when the row holds
    NaN). Returns 1 when row_max[r] is not finite, else 0."""
    row, gm = x[r], gmax[r]
    best, nan = _group_maxima(row, gm)
    if nan:
        tokens[r], row_max[r] = -1, np.nan
        return 1
    top = gm[best]  # float32, as the logits: y = (x - top) / T is then the eager path's float32 value
    row_max[r] = top
    min_p_log = _F(math.log(min_p[r])) if min_p[r] > 0 else _F(-np.inf)  # min_p 0: no floor
    if kind[r] == GREEDY_ROW:
        tokens[r] = _draw_greedy(row, best, top)
    elif kind[r] == TOP_K_ROW:
        tokens[r] = _draw_top_k(row, gm, top_k[r], temperature[r], top_p[r], min_p_log, keys[r, 0], keys[r, 1])
    elif math.isfinite(top):  # rows at +inf or all -inf are resolved by the caller
        tokens[r] = _draw_dense(row, gm, top, _F(1.0) / temperature[r], top_p[r], min_p_log, keys[r, 0], keys[r, 1],
                                weights[r])
    else:
        tokens[r] = 0
    return 0 if math.isfinite(top) else 1


def _draw_rows_serial(x, gmax, kind, top_k, temperature, top_p, min_p, keys, tokens, row_max, weights):
    """`_draw_row` for every row, in this thread; returns how many rows' maxima are not finite."""
    special = 0
    for r in range(x.shape[0]):
        special += _draw_row(r, x, gmax, kind, top_k, temperature, top_p, min_p, keys, tokens, row_max, weights)
    return special


def _draw_rows(x, gmax, kind, top_k, temperature, top_p, min_p, keys, tokens, row_max, weights):
    """`_draw_row` for every row, rows spread over numba's threads; returns how many rows' maxima are not
    finite."""
    special = 0
    for r in numba.prange(x.shape[0]):
        special += _draw_row(r, x, gmax, kind, top_k, temperature, top_p, min_p, keys, tokens, row_max, weights)
    return special


if numba is not None:
    _mix32 = numba.njit(inline="always", cache=True)(_mix32)
    _noise_word = numba.njit(inline="always", cache=True)(_noise_word)
    _exp_noise = numba.njit(inline="always", cache=True)(_exp_noise)
    _group_exp_parts = numba.njit(inline="always", cache=True, fastmath={"reassoc", "nsz", "contract"})(
        _group_exp_parts)
    _group_masses = numba.njit(cache=True, fastmath={"reassoc", "nsz", "contract"})(_group_masses)
    _stored_masses = numba.njit(cache=True, fastmath={"reassoc", "nsz", "contract"})(_stored_masses)
    _bucket = numba.njit(inline="always", cache=True)(_bucket)
    _nucleus_masses = numba.njit(cache=True, fastmath={"reassoc", "nsz", "contract"})(_nucleus_masses)
    _race = numba.njit(cache=True)(_race)
    _contending_groups = numba.njit(cache=True)(_contending_groups)
    _group_maxima = numba.njit(inline="always", cache=True)(_group_maxima)
    _largest = numba.njit(cache=True)(_largest)
    _candidates = numba.njit(cache=True)(_candidates)
    _draw_greedy = numba.njit(cache=True)(_draw_greedy)
    _draw_top_k = numba.njit(cache=True)(_draw_top_k)
    _top_p_threshold = numba.njit(cache=True)(_top_p_threshold)
    _draw_dense = numba.njit(cache=True)(_draw_dense)
    _draw_row = numba.njit(cache=True)(_draw_row)
    _draw_rows_serial = numba.njit(cache=True)(_draw_rows_serial)
    _draw_rows = numba.njit(parallel=True, cache=True)(_draw_rows)


def warm_up() -> None:
    """Compile (or load from the disk cache) both row loops now, through `draw_rows` with the argument
    types a step passes: the first steps then pay no compilation (seconds)."""
    params = [SamplingParams(temperature=0.0), SamplingParams(top_k=2, top_p=0.5), SamplingParams(top_p=0.5)]
    for rows in (1, 3 * PARALLEL_TOP_P_ROWS):
        batch = build_batch([params[b % len(params)] for b in range(rows)], 4 * GROUP, None, 0)
        draw_rows(torch.zeros(rows, 4 * GROUP), batch, np.empty(rows, np.int64), np.empty(rows, np.float32),
                  np.empty((rows, 4), np.float32), np.empty((rows, 4 * GROUP), np.float32))


def draw_rows(x: torch.Tensor, batch: SamplingBatch, tokens: np.ndarray, row_max: np.ndarray,
              maxima: np.ndarray, weights: np.ndarray) -> bool:
    """Draw every row of x [B, V] float32 (contiguous, CPU, penalties applied) into tokens [B] int64
    and row_max [B] float32 (NaN for rows holding NaN, whose token is -1), in place; returns whether
    every row_max is finite. Rows at +inf and all--inf rows get token 0 here (the caller resolves them).
    Scratch arrays the kernel writes (the caller's workspace: no allocation per call): maxima [B,
    ceil(V / GROUP)] float32 for the group maxima; weights [B, V] float32, written by dense top-p rows only."""
    size = batch.size
    threaded = size >= PARALLEL_ROWS or (size >= PARALLEL_TOP_P_ROWS and batch.nucleus_rows >= PARALLEL_TOP_P_ROWS)
    draw = _draw_rows if threaded else _draw_rows_serial
    host = batch.host
    return draw(x.numpy(), maxima, host.kind, host.top_k, host.temperature, host.top_p, host.min_p, host.keys, tokens,
                row_max, weights) == 0
