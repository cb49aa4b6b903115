package placement

import (
	"fmt"
	"slices"
)

// InsufficientError says a domain (or a node, for unpinned pods) lacks free GPUs.
type InsufficientError struct {
	Requested int
	Free      int
}

func (e *InsufficientError) Error() string {
	return fmt.Sprintf("%d GPUs requested but only %d free", e.Requested, e.Free)
}

// ChooseGPUs picks k free GPUs of one domain. domain lists the domain's GPU indexes in
// ascending order; inUse reports GPUs already given to running containers.
//
// It prefers aligned blocks, buddy style: a block of size b (the power of two >= k) at an
// offset that is a multiple of b within the domain. Among the blocks that can hold the pod it
// takes the one with the fewest free GPUs, then the one inside the most-used enclosing block,
// so that free GPUs stay together in whole aligned blocks for later large requests. Aligned
// blocks are also the partitions NVIDIA Fabric Manager's Shared NVSwitch mode offers. When no
// block of size b can hold the pod it tries blocks of 2b, 4b, …, and finally the whole domain,
// taking the lowest free GPUs. The result is sorted and deterministic.
func ChooseGPUs(k int, domain []int, inUse func(gpu int) bool) ([]int, error) {
	if k <= 0 {
		return nil, fmt.Errorf("a container must ask for at least 1 GPU, not %d", k)
	}
	n := len(domain)
	free := make([]bool, n)
	nFree := 0
	for i, g := range domain {
		free[i] = !inUse(g)
		if free[i] {
			nFree++
		}
	}
	if nFree < k {
		return nil, &InsufficientError{Requested: k, Free: nFree}
	}
	countFree := func(lo, hi int) int {
		c := 0
		for i := lo; i < min(hi, n); i++ {
			if free[i] {
				c++
			}
		}
		return c
	}
	b := 1
	for b < k {
		b *= 2
	}
	for s := b; ; s *= 2 {
		best, bestFree := -1, 0
		var bestScore []int
		for off := 0; off < n; off += s {
			f := countFree(off, off+s)
			if f < k {
				continue
			}
			score := parentScore(off, s, n, f, countFree)
			if best < 0 || f < bestFree || (f == bestFree && slices.Compare(score, bestScore) < 0) {
				best, bestFree, bestScore = off, f, score
			}
		}
		if best >= 0 {
			out := make([]int, 0, k)
			for i := best; i < min(best+s, n) && len(out) < k; i++ {
				if free[i] {
					out = append(out, domain[i])
				}
			}
			return out, nil
		}
		if s >= n {
			// Unreachable: at s >= n the one block is the whole domain, which has >= k free.
			return nil, &InsufficientError{Requested: k, Free: nFree}
		}
	}
}

// parentScore lists, from the nearest enclosing block outwards, how many GPUs outside the
// candidate are free in each enclosing aligned block. Lower means the candidate sits among
// used GPUs, which is where a new allocation fragments least.
func parentScore(off, s, n, ownFree int, countFree func(lo, hi int) int) []int {
	var score []int
	for p := 2 * s; p < 2*n; p *= 2 {
		lo := off / p * p
		score = append(score, countFree(lo, lo+p)-ownFree)
	}
	return score
}

// PackUnpinned picks k GPUs for a container that has no domain (a non-TP pod in account mode,
// or one admitted while the webhook was down). Such a container does not need NVLink, so it
// should spend the GPUs that serve tensor-parallel pods least:
//  1. every free GPU in no domain first;
//  2. the rest from the domain where it fits tightest (fewest free GPUs left, then the more
//     used domain, then the lower id), as aligned as ChooseGPUs can make it. The design asks for
//     "the most-used domain that fits"; tightest fit is that rule made precise for domains of
//     different sizes: 2 GPUs into a 4-GPU domain with 2 free beats 2 GPUs into an 8-GPU
//     domain with 4 used, because the latter breaks the last 4-GPU block;
//  3. when no single domain has room for the rest, free GPUs across domains, tightest first.
//
// domains lists each domain's GPU indexes by id; unlinked the GPUs in no domain.
func PackUnpinned(k int, domains [][]int, unlinked []int, inUse func(gpu int) bool) ([]int, error) {
	if k <= 0 {
		return nil, fmt.Errorf("a container must ask for at least 1 GPU, not %d", k)
	}
	var out []int
	for _, g := range unlinked {
		if len(out) < k && !inUse(g) {
			out = append(out, g)
		}
	}
	rest := k - len(out)
	if rest == 0 {
		return slices.Sorted(slices.Values(out)), nil
	}
	type dom struct{ id, free, used int }
	var ds []dom
	total := len(out)
	for id, gpus := range domains {
		f := 0
		for _, g := range gpus {
			if !inUse(g) {
				f++
			}
		}
		ds = append(ds, dom{id, f, len(gpus) - f})
		total += f
	}
	if total < k {
		return nil, &InsufficientError{Requested: k, Free: total}
	}
	slices.SortFunc(ds, func(a, b dom) int {
		if a.free != b.free {
			return a.free - b.free
		}
		if a.used != b.used {
			return b.used - a.used
		}
		return a.id - b.id
	})
	for _, d := range ds {
		if d.free >= rest {
			picked, err := ChooseGPUs(rest, domains[d.id], inUse)
			if err != nil {
				return nil, err
			}
			return slices.Sorted(slices.Values(append(out, picked...))), nil
		}
	}
	for _, d := range ds {
		for _, g := range domains[d.id] {
			if len(out) < k && !inUse(g) {
				out = append(out, g)
			}
		}
	}
	return slices.Sorted(slices.Values(out)), nil
}
