// The 3D planner in the browser: minidist's formulas, ported line by line.
//
// Every function below has a Python original, named in its comment; the
// port keeps the original's order of operations, so that the page's numbers
// are the library's (tests/viz/test_planner_page_browser.py holds them to
// `predict_step` and `compare_plans` for a grid of settings). Read
// minidist/parallel/mesh/plan_3d.py's docstring for the formulas themselves.
//
//   the model's counts        minidist/parallel/mesh/plan_inputs.py (GPTShape, why_not)
//   a layer's activations     minidist/memory.py (transformer_block_activation_terms)
//   a collective's seconds    the ring formulas of the collectives' registry (costmodel.predict)
//   the pipeline's schedules  minidist/parallel/pipeline/schedules.py (gpipe, 1f1b, interleaved)
//   the virtual clock         minidist/parallel/pipeline/simulate.py (simulate_schedule)
//   one step                  minidist/parallel/mesh/plan_3d.py (predict_step)
//   every plan compared       minidist/parallel/mesh/choose_plan.py (compare_plans)
(function () {
  "use strict";

  const CONFIG = JSON.parse(document.getElementById("planner-config").textContent);
  const UNIT_NS = 1000000;      // the clock's unit: a cost of 1 is a millisecond (actions.UNIT_NS)

  // ------------------------------------------------------------ the model (plan_inputs.GPTShape)

  function positions(g) { return g.block_size == null ? g.seq_len : g.block_size; }

  // GPTShape.block_parameters: 12 h^2 / t + 7 h / t + 6 h with biases.
  function blockParameters(g, tp) {
    const h = g.n_embd;
    if (g.bias) return Math.floor((12 * h * h + 7 * h) / tp) + 6 * h;
    return Math.floor(12 * h * h / tp) + 2 * h;
  }

  // GPTShape.parameters: every parameter, the tied embedding once.
  function parameters(g) {
    const h = g.n_embd;
    const finalNorm = g.bias ? 2 * h : h;
    return g.n_layer * blockParameters(g, 1) + g.vocab_size * h + positions(g) * h + finalNorm;
  }

  // GPTShape.matmul_parameters: N_mm = 12 L h^2 + V h.
  function matmulParameters(g) {
    return 12 * g.n_layer * g.n_embd * g.n_embd + g.vocab_size * g.n_embd;
  }

  // memory.transformer_block_activation_terms, summed: one block's bytes kept for backward.
  function blockActivationBytes(batch, seqLen, nEmbd, nHead, itemsize, recompute, tp, sp) {
    const n = tp, btd = batch * seqLen * nEmbd, bt = batch * seqLen;
    if (recompute) return (sp ? Math.floor(btd / n) : btd) * itemsize;
    const hidden = 4 * btd;
    const copy = Math.floor(nHead / n) > 1 ? Math.floor(btd / n) : 0;
    const local = sp ? n : 1;      // what the sequence split divides
    let values = Math.floor(2 * (2 * btd + bt) / local)          // layer norms
      + Math.floor(3 * btd / n)                                   // q, k, v
      + Math.floor(batch * nHead * seqLen * seqLen / n)           // the probabilities P
      + Math.floor(btd / n) + copy                                // heads' output, its copy
      + Math.floor(3 * hidden / n);                               // c_fc, GELU, Phi(x)
    if (n === 1) {
      values += 2 * btd;                                          // the row layers' outputs
    } else {
      if (sp) values += 2 * btd;                                  // the gathered inputs
      values += 2 * btd;                                          // the partial products
      values += Math.floor(2 * btd / local);                      // the summed copies
      values += Math.floor(2 * btd / local);                      // the bias added
    }
    values += Math.floor(2 * btd / local);                        // the residual sums
    return values * itemsize;
  }

  // GPTShape.layer_activation_bytes.
  function layerActivationBytes(g, tp, sp, recompute, itemsize) {
    return blockActivationBytes(g.micro_batch, g.seq_len, g.n_embd, g.n_head, itemsize,
                                recompute, tp, sp && tp > 1);
  }

  // plan_inputs.Plan.__str__: "dp8 tp8 pp16 sp zero1 recompute v2".
  function planName(plan) {
    let name = `dp${plan.dp} tp${plan.tp} pp${plan.pp}`;
    if (plan.sequence_parallel) name += " sp";
    if (plan.zero_stage) name += ` zero${plan.zero_stage}`;
    if (plan.recompute) name += " recompute";
    if (plan.virtual_stages > 1) name += ` v${plan.virtual_stages}`;
    return name;
  }

  // plan_inputs.why_not: why a plan cannot split the model (null when it can).
  function whyNot(g, plan) {
    if (g.n_head % plan.tp) return `tp=${plan.tp} does not divide the ${g.n_head} heads`;
    if (plan.sequence_parallel && g.seq_len % plan.tp)
      return `sequence parallelism: tp=${plan.tp} does not divide seq_len=${g.seq_len}`;
    const pieces = plan.pp * plan.virtual_stages;
    if (g.n_layer % pieces)
      return `pp x virtual_stages = ${pieces} does not divide the ${g.n_layer} layers`;
    if (g.global_batch % (plan.dp * g.micro_batch))
      return `dp x micro_batch = ${plan.dp} x ${g.micro_batch} does not divide the ` +
             `global batch of ${g.global_batch} sequences`;
    return null;
  }

  // GPTShape's own checks (its __post_init__), the one a slider can break.
  function shapeProblem(g) {
    if (g.n_embd % g.n_head) return `n_embd=${g.n_embd} must be a multiple of n_head=${g.n_head}`;
    return null;
  }

  // ------------------------------------------------------------ the collectives (ring formulas)

  // The registry's ring formulas, as its compiler writes them out (alpha, beta, gamma of a link;
  // xbeta is beta on a full-duplex link). One rank: no call, 0 s (costmodel.predict).
  const RING = {
    all_reduce: (n, N, P) => 2 * (n - 1) * P.alpha + 2 * (n - 1) / n * N * P.beta
                             + (n - 1) / n * N * P.gamma,
    all_gather: (n, N, P) => (n - 1) * (P.alpha + N / n * P.beta),
    reduce_scatter: (n, N, P) => (n - 1) * (P.alpha + N / n * (P.beta + P.gamma)),
  };

  function predictCollective(kind, n, nbytes, link) {
    return n === 1 ? 0 : RING[kind](n, nbytes, link);
  }

  // Machine.link: the intra-node link when a group's span fits in a node.
  function link(machine, span) { return span <= machine.node_size ? machine.intra : machine.inter; }
  function linkName(machine, span) { return span <= machine.node_size ? "intra-node" : "inter-node"; }

  // ------------------------------------------------------------ the schedules (schedules.py)

  // An action is one number, so that a schedule of 128 stages and 16,384 micro-batches (8
  // million actions) is built and run in a blink: kind + 8 (chunk + 8 micro-batch), the kinds
  // numbered below (what schedules.Action holds: its kind, micro-batch and chunk).
  const F = 0, B = 1, SEND_ACT = 2, RECV_ACT = 3, SEND_GRAD = 4, RECV_GRAD = 5, STEP = 6;
  const KIND_NAMES = ["F", "B", "send_act", "recv_act", "send_grad", "recv_grad", "step"];
  const action = (kind, mb, chunk) => kind + 8 * (chunk + 8 * mb);
  const kindOf = (code) => code & 7;
  const chunkOf = (code) => (code >> 3) & 7;
  const microbatchOf = (code) => Math.floor(code / 64);

  // An action as words, "F:3:1" (kind, micro-batch, chunk), to set beside Python's.
  function describe(code) {
    const kind = kindOf(code);
    return `${KIND_NAMES[kind]}:${kind === STEP ? null : microbatchOf(code)}:${chunkOf(code)}`;
  }

  // _RankBuilder (the loop placement): a rank's forwards and backwards with the messages
  // around them; chunks of one rank that neighbour hand over in memory.
  function rankBuilder(rank, ranks, virtualStages, microbatches) {
    const last = ranks * virtualStages - 1, actions = [];
    const stageOf = (chunk) => chunk * ranks + rank;
    const peer = (stage) => { const r = stage % ranks; return r === rank ? null : r; };
    const exists = (mb) => microbatches == null || mb < microbatches;
    return {
      forward(mb, chunk) {
        if (!exists(mb)) return;
        const stage = stageOf(chunk);
        if (stage > 0 && peer(stage - 1) !== null) actions.push(action(RECV_ACT, mb, chunk));
        actions.push(action(F, mb, chunk));
        if (stage < last && peer(stage + 1) !== null) actions.push(action(SEND_ACT, mb, chunk));
      },
      backward(mb, chunk) {
        if (!exists(mb)) return;
        const stage = stageOf(chunk);
        if (stage < last && peer(stage + 1) !== null) actions.push(action(RECV_GRAD, mb, chunk));
        actions.push(action(B, mb, chunk));
        if (stage > 0 && peer(stage - 1) !== null) actions.push(action(SEND_GRAD, mb, chunk));
      },
      step() { actions.push(action(STEP, 0, 0)); return actions; },
    };
  }

  // schedules.gpipe: every forward, then every backward.
  function gpipe(p, m) {
    const actions = [];
    for (let rank = 0; rank < p; rank++) {
      const b = rankBuilder(rank, p, 1, null);
      for (let mb = 0; mb < m; mb++) b.forward(mb, 0);
      for (let mb = 0; mb < m; mb++) b.backward(mb, 0);
      actions.push(b.step());
    }
    return { name: "gpipe", stages: p, microbatches: m, virtual_stages: 1, actions };
  }

  // schedules.one_f_one_b: warm-up of min(p - r - 1, m) forwards, then one forward one backward.
  function oneFOneB(p, m) {
    const actions = [];
    for (let rank = 0; rank < p; rank++) {
      const b = rankBuilder(rank, p, 1, null);
      const warmup = Math.min(p - rank - 1, m);
      for (let mb = 0; mb < warmup; mb++) b.forward(mb, 0);
      for (let oldest = 0; oldest < m - warmup; oldest++) {
        b.forward(warmup + oldest, 0);
        b.backward(oldest, 0);
      }
      for (let oldest = m - warmup; oldest < m; oldest++) b.backward(oldest, 0);
      actions.push(b.step());
    }
    return { name: "1f1b", stages: p, microbatches: m, virtual_stages: 1, actions };
  }

  // schedules._interleaved_order: rounds of p micro-batches, chunk by chunk.
  function interleavedOrder(p, rounds, v, backward) {
    const order = [];
    for (let first = 0; first < rounds * p; first += p)
      for (let c = 0; c < v; c++) {
        const chunk = backward ? v - 1 - c : c;
        for (let offset = 0; offset < p; offset++) order.push([first + offset, chunk]);
      }
    return order;
  }

  // schedules.interleaved_one_f_one_b: Megatron-LM's warm-up of (v - 1) p + 2 (p - r - 1).
  function interleaved(p, m, v) {
    const rounds = Math.ceil(m / p);
    const forwards = interleavedOrder(p, rounds, v, false);
    const backwards = interleavedOrder(p, rounds, v, true);
    const total = forwards.length, actions = [];
    for (let rank = 0; rank < p; rank++) {
      const b = rankBuilder(rank, p, v, m);
      const warmup = Math.min(total, (v - 1) * p + 2 * (p - rank - 1));
      for (let i = 0; i < warmup; i++) b.forward(...forwards[i]);
      for (let i = 0; i < total - warmup; i++) {
        b.forward(...forwards[warmup + i]);
        b.backward(...backwards[i]);
      }
      for (let i = total - warmup; i < total; i++) b.backward(...backwards[i]);
      actions.push(b.step());
    }
    return { name: "interleaved_1f1b", stages: p, microbatches: m, virtual_stages: v, actions };
  }

  // schedules.make_schedule, for the schedules the page offers.
  function makeSchedule(name, p, m, v) {
    if (name === "interleaved_1f1b") return interleaved(p, m, v);
    if (v !== 1) throw new Error(`schedule '${name}' has one stage per rank; virtual_stages=${v} ` +
                                 "needs schedule='interleaved_1f1b'");
    if (name === "gpipe") return gpipe(p, m);
    if (name === "1f1b") return oneFOneB(p, m);
    throw new Error(`the page offers no schedule '${name}'`);
  }

  // plan_3d.peak_live: the most (micro-batch, chunk) activations each rank holds at once.
  function peakLive(schedule) {
    return schedule.actions.map((actions) => {
      let live = 0, peak = 0;
      for (const code of actions) {
        const kind = kindOf(code);
        live += (kind === F) - (kind === B);
        peak = Math.max(peak, live);
      }
      return peak;
    });
  }

  // ------------------------------------------------------------ the virtual clock (simulate.py)

  // Python's round(): halves to the even neighbour (simulate._ticks rounds to whole ns so).
  function roundHalfEven(x) {
    const floor = Math.floor(x), rest = x - floor;
    if (rest > 0.5) return floor + 1;
    if (rest < 0.5) return floor;
    return floor % 2 === 0 ? floor : floor + 1;
  }

  function ticks(value) { return roundHalfEven(value * UNIT_NS); }

  // simulate_schedule, its compute regions only: each rank runs its actions in order, a forward
  // costs F, a backward B (after a recomputation of F), a send never waits, a receive waits for
  // its message's arrival, transfer after its send. Returns the first region's start and the
  // last one's end, in ns.
  //
  // Python sweeps the ranks in turn until none can move; here a rank that must wait is put
  // aside until the message it waits for is sent, so each action is visited once (the times
  // are the same: a rank's clock depends only on its own actions and on when its messages
  // were sent, not on the order in which the ranks are visited).
  function simulate(schedule, forwardTime, backwardTime, transferTime, recompute) {
    const f = ticks(forwardTime), b = ticks(backwardTime), t = ticks(transferTime);
    const p = schedule.stages, actions = schedule.actions, total = p * schedule.virtual_stages;
    const where = new Int32Array(p), clock = new Float64Array(p);
    // A message by its tag (schedules.message_tag): what it carries, to which stage.
    const tag = (grad, mb, stage) => 2 * (mb * total + stage) + (grad ? 1 : 0);
    // Each message is sent once and received once: its arrival (-1: not sent yet) and the
    // rank waiting for it (-1: none) are kept in arrays indexed by its tag.
    const tags = 2 * schedule.microbatches * total;
    const arrivals = new Float64Array(tags).fill(-1), waiting = new Int32Array(tags).fill(-1);
    const ready = [];
    for (let rank = p - 1; rank >= 0; rank--) ready.push(rank);
    let start = Infinity, end = -Infinity;
    const work = (rank, cost) => {
      start = Math.min(start, clock[rank]);
      clock[rank] += cost;
      end = Math.max(end, clock[rank]);
    };
    while (ready.length) {
      const rank = ready.pop(), mine = actions[rank];
      while (where[rank] < mine.length) {
        const code = mine[where[rank]], kind = kindOf(code);
        const mb = microbatchOf(code), stage = chunkOf(code) * p + rank;
        if (kind === RECV_ACT || kind === RECV_GRAD) {
          const key = tag(kind === RECV_GRAD, mb, stage);
          const arrival = arrivals[key];
          if (arrival < 0) { waiting[key] = rank; break; }   // not sent yet: the rank waits
          if (arrival > clock[rank]) clock[rank] = arrival;
        } else if (kind === SEND_ACT || kind === SEND_GRAD) {
          const grad = kind === SEND_GRAD;
          const key = tag(grad, mb, stage + (grad ? -1 : 1));
          arrivals[key] = clock[rank] + t;
          if (waiting[key] >= 0) ready.push(waiting[key]);
        } else if (kind === STEP) {
          work(rank, 0);                                // the optimizer step: 0 s on the clock
        } else if (kind === F) {
          work(rank, f);
        } else {
          if (recompute) work(rank, f);
          work(rank, b);
        }
        where[rank] += 1;
      }
    }
    if (where.some((w, rank) => w < actions[rank].length))
      throw new Error(`schedule '${schedule.name}' deadlocks`);
    return { start, end };
  }

  // ------------------------------------------------------------ one step (plan_3d.predict_step)

  // plan_3d.parameters_per_rank.
  function parametersPerRank(g, tp, pp, v) {
    const h = g.n_embd, pieces = pp * v;
    const blocks = Math.floor(g.n_layer / pieces) * v * blockParameters(g, tp);
    const counts = new Array(pp).fill(blocks);
    counts[0] += Math.floor(g.vocab_size * h / tp) + positions(g) * h;
    counts[pp - 1] += g.bias ? 2 * h : h;
    if (pp > 1) counts[pp - 1] += Math.floor(g.vocab_size * h / tp);   // the tied matrix, again
    return counts;
  }

  // plan_3d._model_states: 16 bytes a parameter, sharded over dp by ZeRO's stage.
  function modelStates(params, dp, zeroStage) {
    return {
      parameters: 4 * params / (zeroStage >= 3 ? dp : 1),
      gradients: 4 * params / (zeroStage >= 2 ? dp : 1),
      optimizer_state: 8 * params / (zeroStage >= 1 ? dp : 1),
    };
  }

  const sum = (values) => values.reduce((a, b) => a + b, 0);

  function predictStep(g, plan, machine, itemsize) {
    const e = itemsize || CONFIG.itemsize;
    const why = shapeProblem(g) || whyNot(g, plan);
    if (why) return { plan, why };
    const s = g.seq_len, b = g.micro_batch, h = g.n_embd;
    const { dp, tp, pp } = plan, v = plan.virtual_stages;
    const m = Math.floor(g.global_batch / (dp * b));
    const links = { tp: linkName(machine, tp), dp: linkName(machine, tp * dp),
                    pp: linkName(machine, tp * dp * pp) };
    const call = (dimension, kind, ranks, nbytes, calls, span) => ({
      dimension, collective: kind, ranks, nbytes, calls, link: linkName(machine, span),
      seconds: predictCollective(kind, ranks, nbytes, link(machine, span)),
    });

    // TP: per block, per pass, two all_reduces (or all_gather + reduce_scatter).
    const blocks = Math.floor(g.n_layer / pp);
    const activation = s * b * h * e;
    const forwardsPerMicrobatch = plan.recompute ? 2 : 1;
    let tpCalls = [];
    if (tp > 1) {
      const kinds = plan.sequence_parallel ? ["all_gather", "reduce_scatter"] : ["all_reduce"];
      const passes = forwardsPerMicrobatch + 1;
      tpCalls = kinds.map((kind) => call("tp", kind, tp, activation, 2 * blocks * passes * m, tp));
    }
    const tpPass = sum(tpCalls.map((c) => 2 * blocks * c.seconds));

    const forwardCompute = 2 * b * s * (matmulParameters(g) + 2 * g.n_layer * s * h)
      / (tp * pp) / machine.flops;
    const forwardTime = forwardCompute + tpPass;
    const backwardTime = 2 * forwardCompute + tpPass;
    const message = plan.sequence_parallel ? activation / tp : activation;
    const pl = link(machine, tp * dp * pp);
    const transfer = pp > 1 ? pl.alpha + message * pl.beta : 0.0;

    // PP: the schedule on the virtual clock, in units of a millisecond.
    const schedule = makeSchedule(plan.schedule, pp, m, v);
    const unit = 1e9 / UNIT_NS;
    const clock = simulate(schedule, forwardTime / v * unit, backwardTime / v * unit,
                           transfer * unit, plan.recompute);
    const makespan = (clock.end - clock.start) * 1e-9;
    const busy = m * (forwardTime * forwardsPerMicrobatch + backwardTime);
    const compute = m * forwardCompute * (forwardsPerMicrobatch + 2);

    // DP: the gradients of the fullest rank's parameters, ZeRO's collectives.
    const perRank = parametersPerRank(g, tp, pp, v);
    let dpCalls = [];
    if (dp > 1) {
      const gradientBytes = Math.max(...perRank) * e;
      const counts = new Map();
      for (const kind of CONFIG.zero_collectives[plan.zero_stage])
        counts.set(kind, (counts.get(kind) || 0) + 1);
      dpCalls = [...counts].map(([kind, calls]) => call("dp", kind, dp, gradientBytes, calls,
                                                        tp * dp));
    }
    const dpComm = sum(dpCalls.map((c) => c.calls * c.seconds));

    // Memory: the rank with the most model states and activations.
    const live = peakLive(schedule);
    const layer = layerActivationBytes(g, tp, plan.sequence_parallel, plan.recompute, e);
    const working = plan.recompute ? layerActivationBytes(g, tp, plan.sequence_parallel, false, e)
      : 0.0;
    const layersPerPiece = Math.floor(g.n_layer / (pp * v));
    let fullest = null;
    for (let rank = 0; rank < pp; rank++) {
      const memory = { ...modelStates(perRank[rank], dp, plan.zero_stage),
                       activations: live[rank] * layersPerPiece * layer + working };
      if (fullest === null || sum(Object.values(memory)) > sum(Object.values(fullest.memory)))
        fullest = { live: live[rank], memory };
    }
    const ppCalls = pp > 1 ? [{ dimension: "pp", collective: "send/recv", ranks: 2,
                                nbytes: message, calls: 2 * m * (pp * v - 1), seconds: transfer,
                                link: links.pp }] : [];
    return {
      plan, name: planName(plan), microbatches: m, compute, tp_comm: busy - compute,
      pp_bubble: Math.max(makespan - busy, 0.0), dp_comm: dpComm, total: makespan + dpComm,
      memory: fullest.memory, memory_total: sum(Object.values(fullest.memory)),
      collectives: [...tpCalls, ...ppCalls, ...dpCalls], forward_time: forwardTime,
      backward_time: backwardTime, transfer_time: transfer, live_microbatches: fullest.live, links,
    };
  }

  // ------------------------------------------------------------ every plan (choose_plan.py)

  // choose_plan.factorisations: every (dp, tp, pp) of the ranks, tp within a node.
  function factorisations(ranks, nodeSize) {
    const found = [];
    for (let tp = 1; tp <= nodeSize; tp++) {
      if (nodeSize % tp || ranks % tp) continue;
      for (let pp = 1; pp <= ranks / tp; pp++)
        if ((ranks / tp) % pp === 0) found.push([ranks / (tp * pp), tp, pp]);
    }
    return found;
  }

  // choose_plan.compare_plans: those that fit, fastest first (a stable sort, as Python's).
  function comparePlans(g, ranks, machine, memoryLimit, options) {
    const ranked = [], tooBig = [], impossible = [];
    for (const [dp, tp, pp] of factorisations(ranks, machine.node_size)) {
      const plan = { dp, tp, pp, ...options };
      const why = whyNot(g, plan);
      if (why) { impossible.push({ plan, name: planName(plan), why }); continue; }
      const step = predictStep(g, plan, machine);
      (step.memory_total <= memoryLimit ? ranked : tooBig).push(step);
    }
    ranked.sort((a, b) => a.total - b.total);
    tooBig.sort((a, b) => a.memory_total - b.memory_total);
    return { ranks, ranked, tooBig, impossible, best: ranked.length ? ranked[0] : null };
  }

  // ------------------------------------------------------------ the page

  const $ = (id) => document.getElementById(id);
  const controls = () => Array.from(document.querySelectorAll("[data-setting]"));

  // A slider's position is an index into its list of values (data-values).
  function valueOf(control) {
    if (control.type === "checkbox") return control.checked;
    if (control.type === "range") return JSON.parse(control.dataset.values)[Number(control.value)];
    if (control.dataset.kind === "int") return Number(control.value);
    return control.value;
  }

  function setControl(control, value) {
    if (control.type === "checkbox") control.checked = Boolean(value);
    else if (control.type === "range") {
      const values = JSON.parse(control.dataset.values);
      const index = values.indexOf(value);
      if (index < 0) throw new Error(`${control.dataset.setting}: ${value} is not among the ` +
                                     `slider's values ${values.join(", ")}`);
      control.value = String(index);
    } else control.value = String(value);
  }

  function readSettings() {
    const settings = {};
    for (const control of controls()) settings[control.dataset.setting] = valueOf(control);
    return settings;
  }

  // The page's settings as the library's three inputs (viz/planner_page.py's
  // shape_of, plan_of and machine_of say the same in Python).
  function inputsOf(st) {
    const g = { n_layer: st.n_layer, n_embd: st.n_embd, n_head: st.n_head,
                vocab_size: st.vocab_size, seq_len: st.seq_len, global_batch: st.global_batch,
                micro_batch: st.micro_batch, bias: true, block_size: null };
    const interleavedSchedule = st.schedule === "interleaved_1f1b";
    const plan = { dp: st.dp, tp: st.tp, pp: st.pp, schedule: st.schedule,
                   virtual_stages: interleavedSchedule ? st.virtual_stages : 1,
                   sequence_parallel: st.sequence_parallel, zero_stage: Number(st.zero_stage),
                   recompute: st.recompute === "full" };
    const machine = { flops: st.tflops * 1e12, node_size: st.node_size,
                      intra: { alpha: CONFIG.alpha.intra, beta: 1 / (st.intra_gbs * 1e9), gamma: 0 },
                      inter: { alpha: CONFIG.alpha.inter, beta: 1 / (st.inter_gbs * 1e9), gamma: 0 } };
    return { g, plan, machine, memoryLimit: st.memory_gb * 1e9 };
  }

  function ms(seconds) {
    return `${(seconds * 1e3).toLocaleString("en", { maximumFractionDigits: 2 })} ms`;
  }
  function gb(nbytes) {
    return nbytes >= 1e7 ? `${(nbytes / 1e9).toLocaleString("en", { maximumFractionDigits: 2 })} GB`
      : `${(nbytes / 1e6).toLocaleString("en", { maximumFractionDigits: 2 })} MB`;
  }

  // A number shown, with its exact value kept in data-value for anyone who checks it.
  function show(id, value, text) {
    const element = $(id);
    element.dataset.value = String(value);
    element.textContent = text;
  }

  function stackedBar(id, parts, scale) {
    const bar = $(id);
    for (const [name, value] of Object.entries(parts)) {
      const piece = bar.querySelector(`[data-part="${name}"]`);
      piece.style.width = `${scale > 0 ? 100 * value / scale : 0}%`;
      piece.title = `${name.replace("_", " ")}: ${id.startsWith("memory") ? gb(value) : ms(value)}`;
    }
  }

  const MEMORY = ["parameters", "gradients", "optimizer_state", "activations"];
  const TIME = ["compute", "tp_comm", "pp_bubble", "dp_comm"];

  function render() {
    const st = readSettings();
    for (const control of controls()) {
      const out = document.querySelector(`output[for="${control.id}"]`);
      if (out) out.textContent = String(valueOf(control));
    }
    $("virtual_stages").disabled = st.schedule !== "interleaved_1f1b";
    const { g, plan, machine, memoryLimit } = inputsOf(st);
    const ranks = plan.dp * plan.tp * plan.pp;
    const step = predictStep(g, plan, machine);
    const page = document.querySelector(".planner");
    page.dataset.state = step.why ? "impossible" : "predicted";
    $("why").textContent = step.why ? `${planName(plan)} cannot split this model: ${step.why}` : "";
    $("summary").textContent = `${planName(plan)}: ${ranks.toLocaleString("en")} ranks, ` +
      `a GPT of ${(parameters(g) / 1e9).toFixed(2)} B parameters` +
      (step.why ? "" : `, ${step.microbatches} micro-batches a pipeline, ` +
       `${step.live_microbatches} held at the fullest rank's peak`);
    if (step.why) {
      // No prediction: every number is blanked rather than left from the last plan.
      for (const id of [...MEMORY.map((n) => `memory-${n}`), "memory-total",
                        ...TIME.map((n) => `time-${n}`), "time-total"]) {
        delete $(id).dataset.value;
        $(id).textContent = "-";
      }
      $("fits").textContent = "";
      delete $("fits").dataset.fits;
      $("collectives").textContent = "";
    } else {
      for (const name of MEMORY) show(`memory-${name}`, step.memory[name], gb(step.memory[name]));
      show("memory-total", step.memory_total, gb(step.memory_total));
      show("memory-limit", memoryLimit, gb(memoryLimit));
      const fits = step.memory_total <= memoryLimit;
      $("fits").dataset.fits = String(fits);
      $("fits").textContent = fits ? "fits" : "does NOT fit";
      $("memory-bar").classList.toggle("over", !fits);
      const scale = Math.max(step.memory_total, memoryLimit);
      stackedBar("memory-bar", step.memory, scale);
      $("memory-limit-line").style.left = `${100 * memoryLimit / scale}%`;
      for (const name of TIME) show(`time-${name}`, step[name], ms(step[name]));
      show("time-total", step.total, ms(step.total));
      stackedBar("time-bar", Object.fromEntries(TIME.map((n) => [n, step[n]])), step.total);
      $("collectives").textContent = step.collectives.map((c) =>
        `${c.dimension}: ${c.calls} x ${c.collective} of ${gb(c.nbytes)} on ${c.ranks} ranks, ` +
        `${c.link}: ${ms(c.seconds)} each`).join("\n");
    }
    renderComparison(g, ranks, machine, memoryLimit, plan);
  }

  function renderComparison(g, ranks, machine, memoryLimit, plan) {
    const { dp, tp, pp, ...options } = plan;
    const comparison = comparePlans(g, ranks, machine, memoryLimit, options);
    const best = $("best-plan");
    best.dataset.plan = comparison.best ? comparison.best.name : "";
    best.textContent = comparison.best
      ? `${comparison.best.name}: ${ms(comparison.best.total)}, ${gb(comparison.best.memory_total)} a rank`
      : `none of the ${ranks.toLocaleString("en")} ranks' plans fits in ${gb(memoryLimit)} a rank`;
    $("use-best").disabled = !comparison.best;
    const rows = [];
    const row = (step, fits) => {
      const tr = document.createElement("tr");
      tr.dataset.plan = step.name;
      if (comparison.best && step === comparison.best) tr.classList.add("best");
      if (step.name === planName(plan)) tr.classList.add("current");
      if (!fits) tr.classList.add("over");
      for (const text of [step.name, ms(step.total), ms(step.compute), ms(step.tp_comm),
                          ms(step.pp_bubble), ms(step.dp_comm), gb(step.memory_total),
                          fits ? "fits" : "too big"]) {
        const td = document.createElement("td");
        td.textContent = text;
        tr.appendChild(td);
      }
      rows.push(tr);
    };
    comparison.ranked.forEach((step) => row(step, true));
    comparison.tooBig.forEach((step) => row(step, false));
    $("plans").replaceChildren(...rows);
    $("impossible").textContent = comparison.impossible.map((x) => `${x.name}: ${x.why}`).join("\n");
  }

  function applyPreset(kind, name) {
    const preset = CONFIG.presets[kind][name];
    if (!preset) return;
    for (const [setting, value] of Object.entries(preset)) {
      const control = document.querySelector(`[data-setting="${setting}"]`);
      if (control) setControl(control, value);
    }
  }

  // set({dp: 4, ...}): the controls moved as a student would move them, then the page redrawn.
  function set(settings) {
    for (const [setting, value] of Object.entries(settings)) {
      const control = document.querySelector(`[data-setting="${setting}"]`);
      if (!control) throw new Error(`the page has no control for '${setting}'`);
      setControl(control, value);
    }
    render();
  }

  // A slider dragged sends many input events; the page is redrawn once a frame at most, with
  // the latest settings (at the sliders' far end, 16,384 micro-batches on 128 stages, one
  // redraw takes a few seconds: the clock runs 8 million actions for the largest plan).
  let drawing = false;
  function redrawSoon() {
    if (drawing) return;
    drawing = true;
    requestAnimationFrame(() => { drawing = false; render(); });
  }

  document.addEventListener("DOMContentLoaded", () => {
    for (const control of controls()) {
      control.addEventListener("input", redrawSoon);
      control.addEventListener("change", redrawSoon);
    }
    $("model-preset").addEventListener("change", (event) => {
      applyPreset("models", event.target.value);
      render();
    });
    $("machine-preset").addEventListener("change", (event) => {
      applyPreset("machines", event.target.value);
      render();
    });
    $("use-best").addEventListener("click", () => {
      const name = $("best-plan").dataset.plan;
      const [dp, tp, pp] = name.split(" ").slice(0, 3).map((word) => Number(word.slice(2)));
      set({ dp, tp, pp });
    });
    render();
  });

  window.planner = { predictStep, comparePlans, makeSchedule, describe, simulate, peakLive,
                     factorisations, whyNot, planName, readSettings, inputsOf, set, render };
})();
