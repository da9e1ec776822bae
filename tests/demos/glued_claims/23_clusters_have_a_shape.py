"""Lesson 23's prose chose its words from its numbers: the ring's slowdown
on two nodes, the simulated ring equal to its two-level formula, the
fastest all_reduce in each case named from the simulated times, the
ratios the times', busbw = algbw 2(n-1)/n against the links, the 3D plans'
TP inside and across a node, and the profile's overlap with and without."""


def value(glued, name):
    return glued[name]["value"]


def text(glued, name):
    return glued[name]["text"]


def check(glued):
    # Section 1.
    assert value(glued, "ring_exact") is True
    assert text(glued, "ring_exact_text").startswith("equals")
    assert float(text(glued, "dgx_slowdown")) > 1 and float(text(glued, "com_slowdown")) > 1

    # Section 2: each winner is the fastest of the simulated times.
    times = value(glued, "times_table")
    big = value(glued, "big_n")

    def fastest(cluster, n, label):
        found = {key.split("/")[3]: t for key, t in times.items()
                 if key.startswith(f"{cluster}/{n}/{label}/")}
        return min(found, key=found.get), found

    def among_fastest(name, cluster, n, label):
        """``name`` is one of the fastest (on one node the ring, the hierarchical
        and the 2D ring are the same messages, so their times can tie)."""
        found = fastest(cluster, n, label)[1]
        least = min(found.values())
        return found[name] <= least * (1 + 1e-12)

    assert text(glued, "dgx_small_winner") == fastest("dgx", big, "8 KiB")[0]
    assert text(glued, "com_small_winner") == fastest("commodity", big, "8 KiB")[0]
    assert among_fastest(text(glued, "one_node_dgx"), "dgx", 8, "64 MiB")
    assert among_fastest(text(glued, "one_node_com"), "commodity", 8, "64 MiB")
    assert value(glued, "hier_is_ring_on_one_node") is True
    assert text(glued, "dgx_large_64") == fastest("dgx", 64, "64 MiB")[0] == "hierarchical"
    assert text(glued, "dgx_large_big") == fastest("dgx", big, "64 MiB")[0]  # "again hierarchical"
    assert text(glued, "dgx_large_big") == "hierarchical"
    com64 = fastest("commodity", 64, "64 MiB")
    assert text(glued, "com_large_64") == com64[0] == "ring"
    assert value(glued, "com_hier_over_ring_64") > 1            # "buys nothing there"
    assert text(glued, "com_large_big") == fastest("commodity", big, "64 MiB")[0] == "hierarchical"
    assert value(glued, "com_ring_over_hier_big") > 1
    latency, whole = value(glued, "com_ring_latency"), value(glued, "com_ring_big")
    if text(glued, "com_latency_verdict") == "more than its bytes":
        assert latency > whole - latency
    assert value(glued, "rd_over_rb_com_big") > 1               # "takes ... times as long"
    ring = fastest("dgx", 64, "64 MiB")[1]
    assert abs(ring["ring"] / ring["hierarchical"] - value(glued, "dgx_hier_gain_64")) < 1e-9

    # Section 3: the ring's busbw below the NIC, the hierarchical above it.
    assert 0 < value(glued, "dgx_ring_busbw_share") <= 100
    assert value(glued, "dgx_hier_over_nic") > 1                # "times the NIC's"

    # Section 4: TP across nodes costs more; the best plans as chosen.
    assert value(glued, "dgx_tp_ratio") > 1
    assert value(glued, "com_over_dgx") > 1
    if value(glued, "best_differ"):
        assert text(glued, "best_text") == "another plan"
    else:
        assert text(glued, "best_text") == "the same plan"

    # Section 5: more overlapped with overlap on; the exposed verdict its numbers'.
    verdict, ratio = text(glued, "exposed_verdict"), value(glued, "exposed_ratio")
    assert (verdict.startswith("less") and ratio < 0.9) or \
        (verdict.startswith("about the same") and 0.9 <= ratio <= 1.1) or \
        (verdict.startswith("more") and ratio > 1.1)
    assert value(glued, "on_more") is True and text(glued, "on_more_text") == "more"
    assert value(glued, "overlap_on") > value(glued, "overlap_off")
