"""The alpha, beta, gamma fits of minidist.bench.p2p, on numbers made to order."""

from __future__ import annotations

import pytest

from minidist.bench import p2p

KIB, MIB = 1 << 10, 1 << 20


def test_alpha_and_beta_come_back_from_exact_times():
    alpha, beta = 5e-6, 1 / 8e9
    points = {size: alpha + size * beta for size in (8, KIB, 64 * KIB, MIB, 16 * MIB)}
    assert p2p.fit_alpha_beta(points) == pytest.approx((alpha, beta), rel=1e-6)


def test_exchange_beta_is_fitted_on_bulk_messages_only():
    alpha, bulk = 5e-6, 1 / 4e9
    points = {size: alpha + size * bulk for size in (256 * KIB, MIB, 4 * MIB)}
    points[64 * KIB] = 100e-6  # per-message overhead still shows at 64 KiB
    assert p2p.fit_exchange_beta(points, alpha, smallest=256 * KIB) == pytest.approx(bulk)
    assert p2p.fit_exchange_beta(points, alpha) > bulk * 1.04  # the small point drags it


def test_gamma_is_seconds_per_byte_combined():
    assert p2p.fit_gamma({MIB: MIB * 2e-10, 4 * MIB: 4 * MIB * 4e-10}) == pytest.approx(3e-10)


def test_fit_sizes_cover_latency_and_the_bulk_up_to_the_largest_message():
    one_way, both_ways = p2p.fit_sizes(3 * MIB)
    assert one_way[:3] == [8, KIB, 8 * KIB]
    assert both_ways == [64 * KIB << k for k in range(6)]  # 64 KiB .. 2 MiB
    assert p2p.fit_sizes(1 << 30)[1][-1] == 64 * MIB  # capped
    assert p2p.fit_sizes(1)[1][-1] == MIB  # at least 1 MiB
