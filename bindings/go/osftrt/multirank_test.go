package osftrt_test

import (
	"fmt"
	"sync"
	"testing"

	"libosftrt/osftrt"
)

// group is an in-process "process group": ranks are goroutines, each with
// its own Context, whose collectives meet here (what a framework's process
// group does across processes).
type group struct {
	n       int
	mu      sync.Mutex
	cond    *sync.Cond
	round   int
	arrived int
	slots   [][]float32
	result  [][]float32
}

func newGroup(n int) *group {
	g := &group{n: n, slots: make([][]float32, n)}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// exchange deposits this rank's data and returns every rank's, in rank order.
func (g *group) exchange(rank int, data []float32) [][]float32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	gen := g.round
	g.slots[rank] = append([]float32(nil), data...)
	g.arrived++
	if g.arrived == g.n {
		g.result, g.slots, g.arrived = g.slots, make([][]float32, g.n), 0
		g.round++
		g.cond.Broadcast()
	} else {
		for gen == g.round {
			g.cond.Wait()
		}
	}
	return g.result
}

type member struct {
	g    *group
	rank int
}

func (m *member) Rank() int { return m.rank }
func (m *member) Size() int { return m.g.n }

func floats(b *osftrt.Buffer) []float32 {
	if b.DType == osftrt.Float32 {
		return b.Float32s()
	}
	v := make([]float32, b.Len)
	for i, x := range b.BF16s() {
		v[i] = x.Float32()
	}
	return v
}

func store(b *osftrt.Buffer, v []float32) {
	if b.DType == osftrt.Float32 {
		copy(b.Float32s(), v)
		return
	}
	d := b.BF16s()
	for i := range d {
		d[i] = osftrt.ToBF16(v[i])
	}
}

func (m *member) AllreduceSum(b *osftrt.Buffer) error {
	all := m.g.exchange(m.rank, floats(b))
	sum := make([]float32, b.Len)
	for _, part := range all { // rank order: every rank sums alike
		for i, x := range part {
			sum[i] += x
		}
	}
	store(b, sum)
	return nil
}

func (m *member) Allgather(send, recv *osftrt.Buffer, counts []int64) error {
	all := m.g.exchange(m.rank, floats(send))
	var cat []float32
	for _, part := range all {
		cat = append(cat, part...)
	}
	store(recv, cat)
	return nil
}

func (m *member) Barrier() error {
	m.g.exchange(m.rank, nil)
	return nil
}

// Vocab-parallel fused cross-entropy over two ranks (goroutines, each with
// its own context and a callback communicator) equals the one-rank call.
func TestVocabParallelFLCEOverGoCollectives(t *testing.T) {
	const M, H, V = 9, 16, 24
	shards := [][2]int64{{0, 10}, {10, 24}}
	x, w := rnd(M*H, 1), rnd(V*H, 1)
	y := make([]int64, M)
	for i := range y {
		y[i] = int64(rng.Intn(V))
	}
	// one rank
	ctx := newCtx(t)
	defer ctx.Close()
	ce, err := osftrt.NewFLCE(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ce.Close()
	loss, gx, gw := nan32(1), nan32(M*H), nan32(V*H)
	if err := ce.Compute(osftrt.FLCEInputs{X: osftrt.MustWrap(x, M, H), Weight: osftrt.MustWrap(w, V, H),
		Targets: osftrt.MustWrap(y, M)}, osftrt.FLCEOutputs{Loss: osftrt.MustWrap(loss, 1),
		GradX: osftrt.MustWrap(gx, M, H), GradWeight: osftrt.MustWrap(gw, V, H)}); err != nil {
		t.Fatal(err)
	}
	// two ranks
	g := newGroup(2)
	type result struct {
		loss, gx, gw []float32
		stats        osftrt.CommStats
		err          error
	}
	res := make([]result, 2)
	var wg sync.WaitGroup
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			out := &res[r]
			c, err := osftrt.NewContext(nil)
			if err != nil {
				out.err = err
				return
			}
			defer c.Close()
			comm, err := osftrt.NewCallbackComm(c, &member{g, r}, nil)
			if err != nil {
				out.err = err
				return
			}
			defer comm.Close()
			o := osftrt.DefaultFLCEOptions()
			o.Comm, o.VocabOffset, o.VocabSizeGlobal = comm, shards[r][0], V
			f, err := osftrt.NewFLCE(c, &o)
			if err != nil {
				out.err = err
				return
			}
			defer f.Close()
			vp := shards[r][1] - shards[r][0]
			out.loss, out.gx, out.gw = nan32(1), nan32(M*H), nan32(int(vp*H))
			out.err = f.Compute(osftrt.FLCEInputs{X: osftrt.MustWrap(x, M, H),
				Weight: osftrt.MustWrap(w[shards[r][0]*H:shards[r][1]*H], vp, H), Targets: osftrt.MustWrap(y, M)},
				osftrt.FLCEOutputs{Loss: osftrt.MustWrap(out.loss, 1), GradX: osftrt.MustWrap(out.gx, M, H),
					GradWeight: osftrt.MustWrap(out.gw, vp, H)})
			if out.err == nil {
				out.stats, out.err = comm.Stats()
			}
		}(r)
	}
	wg.Wait()
	for r, o := range res {
		if o.err != nil {
			t.Fatalf("rank %d: %v", r, o.err)
		}
		if e := relErr(o.loss, f64(loss)); e > 1e-5 {
			t.Errorf("rank %d: loss %v vs one rank %v", r, o.loss[0], loss[0])
		}
		if e := relErr(o.gx, f64(gx)); e > 1e-5 {
			t.Errorf("rank %d: grad_x rel error %g", r, e)
		}
		if e := relErr(o.gw, f64(gw[shards[r][0]*H:shards[r][1]*H])); e > 1e-5 {
			t.Errorf("rank %d: grad_weight shard rel error %g", r, e)
		}
		if o.stats.AllgatherCalls < 1 || o.stats.AllreduceCalls < 1 {
			t.Errorf("rank %d: collectives %+v", r, o.stats)
		}
	}
}

// Gradient projection with U sharded by rows over two ranks (goroutines
// with their own contexts, Go collectives): one all-reduce per step, and
// every rank's rows equal the one-rank projection's.
func TestURowsProjectionOverGoCollectives(t *testing.T) {
	const N, K = 12, 10
	rows := [][2]int64{{0, 5}, {5, 12}}
	ctx := newCtx(t)
	defer ctx.Close()
	layer, err := osftrt.NewFLinear(ctx, osftrt.MustWrap(rnd(N*K, 1), N, K), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer layer.Close()
	uh, sh, _ := osftrt.ReadFactor[float32](layer, osftrt.FactorUHigh)
	ul, sl, _ := osftrt.ReadFactor[float32](layer, osftrt.FactorULow)
	R, L := int(sh[1]), int(sl[1])
	dU := rnd(N*L, 1)
	// float64 reference: dU - U_high (U_high^T dU)
	U, D := f64(uh), f64(dU)
	C := matmul(transpose(U, N, R), R, N, D, L, false)
	P := matmul(U, N, R, C, L, false)
	want := make([]float64, N*L)
	for i := range want {
		want[i] = D[i] - P[i]
	}
	g := newGroup(2)
	errs := make([]error, 2)
	got := make([][]float32, 2)
	var wg sync.WaitGroup
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			fail := func(err error) { errs[r] = err }
			c, err := osftrt.NewContext(nil)
			if err != nil {
				fail(err)
				return
			}
			defer c.Close()
			comm, err := osftrt.NewCallbackComm(c, &member{g, r}, nil)
			if err != nil {
				fail(err)
				return
			}
			defer comm.Close()
			a, b := rows[r][0], rows[r][1]
			part := func(src []float32, cols int) *osftrt.CTensor {
				ct, err := osftrt.NewCTensor(osftrt.Float32, b-a, int64(cols))
				if err != nil {
					panic(err)
				}
				copy(ct.Float32s(), src[int(a)*cols:int(b)*cols])
				return ct
			}
			uhp, gp, ulp := part(uh, R), part(dU, L), part(ul, L)
			p, err := osftrt.NewProjector(c, comm, nil)
			if err != nil {
				fail(err)
				return
			}
			defer p.Close()
			if _, err := p.AddTarget(osftrt.ProjectionTarget{UHigh: uhp, GradULow: gp, ULow: ulp,
				ULayout: osftrt.ShardURows, UShards: []int64{5, 7}}); err != nil {
				fail(err)
				return
			}
			if err := p.Project(); err != nil {
				fail(err)
				return
			}
			if info, err := p.Info(); err != nil || info.CollectivesPerProject != 1 {
				fail(fmt.Errorf("info %+v, %v", info, err))
				return
			}
			if u, _, err := p.Orthogonality(); err != nil || u > 1e-5 {
				fail(fmt.Errorf("orthogonality %g, %v", u, err))
				return
			}
			got[r] = append([]float32(nil), gp.Float32s()...)
		}(r)
	}
	wg.Wait()
	for r := 0; r < 2; r++ {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		a, b := rows[r][0], rows[r][1]
		if e := relErr(got[r], want[int(a)*L:int(b)*L]); e > 1e-5 {
			t.Errorf("rank %d: projected rows rel error %g", r, e)
		}
	}
}
