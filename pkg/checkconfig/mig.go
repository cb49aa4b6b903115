package checkconfig

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// checkMIG compares what a node advertises with what its nvidia.com/mig.config layout makes
// of its GPUs under its MIG strategy, time-sliced by replicas.
func (c *checker) checkMIG(nd node, cfgName string, replicas int) string {
	entries, ok := c.opts.MIGConfig.Configs[cfgName]
	if !ok {
		all := c.opts.MIGConfig.Names()
		return fmt.Sprintf("label %s=%s names no config in --mig-config %s (it has %d: %s); fix the label or add the config to the file",
			names.MIGConfigLabel, cfgName, c.opts.MIGConfigSource, len(all), listSome(all, 6))
	}
	count, ok := nd.intLabel(names.GPUCountLabel)
	if !ok {
		return fmt.Sprintf("label %s=%s but no readable %s label (GPU feature discovery writes it), so the MIG resources cannot be checked",
			names.MIGConfigLabel, cfgName, names.GPUCountLabel)
	}
	strategies := []string{nd.Metadata.Labels[names.MIGStrategyLabel]}
	if strategies[0] == "" {
		// GFD labels the strategy wherever the device plugin runs with one; without the label
		// either strategy may be in use, and the node is fine if it matches one of them.
		strategies = []string{names.MIGStrategyMixed, names.MIGStrategySingle}
	}
	adv := nd.advertised()
	renamed := nd.renamed(adv)
	product := nd.Metadata.Labels[names.GPUProductLabel]
	variants := filterVariants(entries)

	// The reason names the reading that came closest: the fewest differing resources, or the
	// first problem when no reading could be computed.
	var closest string
	closestDiffs := -1
	for _, strategy := range strategies {
		for _, v := range variants {
			want, desc, problem := expectMIG(v.entries, strategy, count, product)
			if problem != "" {
				if closest == "" {
					closest = ": " + problem
				}
				continue
			}
			d := diff(want.shared(replicas, renamed), adv)
			if len(d) == 0 {
				return ""
			}
			if closestDiffs < 0 || len(d) < closestDiffs {
				closestDiffs = len(d)
				closest = " (" + desc + v.describe(len(variants)) + sharingNote(replicas, renamed) + "): " + strings.Join(d, "; ") +
					"; if mig-manager reports success, restart the device plugin on the node, else fix the label"
			}
		}
	}
	return fmt.Sprintf("label %s=%s%s", names.MIGConfigLabel, cfgName, closest)
}

func sharingNote(replicas int, renamed bool) string {
	switch {
	case replicas <= 1:
		return ""
	case renamed:
		return fmt.Sprintf(", time-sliced %s=%d renamed to .shared", names.GPUReplicasLabel, replicas)
	}
	return fmt.Sprintf(", time-sliced %s=%d", names.GPUReplicasLabel, replicas)
}

// variant is the entries of a layout that apply to one GPU model.
type variant struct {
	filter  []string
	entries []MIGEntry
}

func (v variant) describe(n int) string {
	if n <= 1 {
		return ""
	}
	return fmt.Sprintf(", closest of its %d per-model entries: device-filter %s", n, strings.Join(v.filter, ","))
}

// filterVariants splits a layout by device-filter. GPU Operator's all-balanced gives each GPU
// model (a PCI device id) its own entry, but a node dump names the model only as marketing text
// (nvidia.com/gpu.product), not by device id. A node's GPUs are of one model, so the node must
// match the entries of some one model, plus the entries that name no model.
func filterVariants(entries []MIGEntry) []variant {
	var common []MIGEntry
	var out []variant
	for _, e := range entries {
		if len(e.DeviceFilter) == 0 {
			common = append(common, e)
			continue
		}
		f := slices.Sorted(slices.Values(e.DeviceFilter))
		i := slices.IndexFunc(out, func(v variant) bool { return slices.Equal(v.filter, f) })
		if i < 0 {
			out = append(out, variant{filter: f})
			i = len(out) - 1
		}
		out[i].entries = append(out[i].entries, e)
	}
	if len(out) == 0 {
		return []variant{{entries: common}}
	}
	for i := range out {
		out[i].entries = append(slices.Clone(common), out[i].entries...)
	}
	return out
}

// layout is what a config makes of one GPU.
type layout struct {
	enabled bool
	devices map[string]int
}

func (l layout) total() int {
	n := 0
	for _, v := range l.devices {
		n += v
	}
	return n
}

func (l layout) equal(o layout) bool {
	return l.enabled == o.enabled && maps.Equal(l.devices, o.devices)
}

// expectMIG returns the resources a layout yields under a strategy, as the device plugin
// advertises them: mixed gives each profile its own nvidia.com/mig-<profile> (summed over the
// GPUs) and whole GPUs without MIG as nvidia.com/gpu; single gives every MIG device as
// nvidia.com/gpu and needs one profile on all GPUs; none ignores MIG. A GPU that no entry
// names keeps its mode, which for a GPU mig-manager never touched is MIG disabled.
//
// count is nvidia.com/gpu.count. GFD overrides it under the single strategy with the number of
// MIG devices (and appends -MIG-<profile> to nvidia.com/gpu.product), so with that product the
// count is read as devices, not GPUs.
func expectMIG(entries []MIGEntry, strategy string, count int, product string) (want counts, desc, problem string) {
	if strategy == names.MIGStrategySingle {
		if _, profile, ok := strings.Cut(product, names.MIGProductInfix); ok {
			return expectSingleFromDevices(entries, count, product, profile)
		}
	}
	gpus := make([]layout, count)
	for _, e := range entries {
		l := layout{enabled: e.MIGEnabled, devices: e.MIGDevices}
		if e.AllDevices {
			for i := range gpus {
				gpus[i] = l
			}
			continue
		}
		for _, d := range e.Devices {
			if d >= count {
				return nil, "", fmt.Sprintf("it lists GPU %d but %s=%d", d, names.GPUCountLabel, count)
			}
			gpus[d] = l
		}
	}
	want = counts{}
	switch strategy {
	case names.MIGStrategyMixed:
		for _, g := range gpus {
			if !g.enabled {
				want[names.GPUResource]++
				continue
			}
			for p, n := range g.devices {
				want[names.MIGResource(p)] += int64(n)
			}
		}
	case names.MIGStrategySingle:
		if count > 0 && !slices.ContainsFunc(gpus, func(g layout) bool { return !g.equal(gpus[0]) }) && len(gpus[0].devices) <= 1 {
			if gpus[0].enabled {
				want[names.GPUResource] = int64(count * gpus[0].total())
			} else {
				want[names.GPUResource] = int64(count)
			}
			break
		}
		return nil, "", fmt.Sprintf("the %s strategy needs every GPU in the same one-profile layout, which this config does not give; use the %s strategy (%s=%s) or a one-profile config",
			names.MIGStrategySingle, names.MIGStrategyMixed, names.MIGStrategyLabel, names.MIGStrategyMixed)
	case names.MIGStrategyNone:
		if slices.ContainsFunc(gpus, func(g layout) bool { return g.enabled }) {
			return nil, "", fmt.Sprintf("%s=%s advertises no MIG device, but this config enables MIG; set the device plugin's MIG strategy to %s or %s",
				names.MIGStrategyLabel, names.MIGStrategyNone, names.MIGStrategySingle, names.MIGStrategyMixed)
		}
		want[names.GPUResource] = int64(count)
	default:
		return nil, "", fmt.Sprintf("label %s=%q is not a MIG strategy (%s, %s or %s)", names.MIGStrategyLabel, strategy,
			names.MIGStrategySingle, names.MIGStrategyMixed, names.MIGStrategyNone)
	}
	return want, fmt.Sprintf("%s strategy, %d GPUs", strategy, count), ""
}

// expectSingleFromDevices handles the single strategy when GFD has relabelled the node for its
// MIG devices: the devices' profile must be the config's, and the device plugin advertises as
// many nvidia.com/gpu as GFD counted devices, a whole number per GPU.
func expectSingleFromDevices(entries []MIGEntry, devices int, product, profile string) (counts, string, string) {
	var l layout
	for i, e := range entries {
		el := layout{enabled: e.MIGEnabled, devices: e.MIGDevices}
		if i > 0 && !el.equal(l) || len(el.devices) > 1 {
			return nil, "", fmt.Sprintf("the %s strategy needs every GPU in the same one-profile layout, which this config does not give", names.MIGStrategySingle)
		}
		l = el
	}
	if !l.enabled {
		return nil, "", fmt.Sprintf("%s=%s says the GPUs are split into MIG devices, but the config disables MIG; mig-manager has not applied it", names.GPUProductLabel, product)
	}
	for p := range l.devices {
		if names.MIGResource(p) != names.MIGResource(profile) {
			return nil, "", fmt.Sprintf("%s=%s says the GPUs are split into %s devices, but the config makes %s; mig-manager has not applied it", names.GPUProductLabel, product, profile, p)
		}
	}
	per := l.total()
	if per == 0 || devices%per != 0 {
		return nil, "", fmt.Sprintf("%s=%d MIG devices is not a whole number of GPUs at %d per GPU", names.GPUCountLabel, devices, per)
	}
	return counts{names.GPUResource: int64(devices)},
		fmt.Sprintf("%s strategy, %d MIG devices on %d GPUs (%s counts MIG devices under the %s strategy)", names.MIGStrategySingle, devices, devices/per, names.GPUCountLabel, names.MIGStrategySingle), ""
}

func listSome(items []string, limit int) string {
	if len(items) <= limit {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:limit], ", ") + fmt.Sprintf(" and %d more", len(items)-limit)
}
