package checkconfig

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// MIGConfig is a mig-parted config file: named MIG layouts that a node picks with the
// nvidia.com/mig.config label.
type MIGConfig struct {
	Configs map[string][]MIGEntry
}

// MIGEntry is one entry of a named layout: which GPUs it applies to and what it makes of them.
type MIGEntry struct {
	// DeviceFilter limits the entry to GPUs with these PCI device ids ("0x20B010DE"); empty
	// means any GPU. A node dump does not carry device ids, see expectMIG.
	DeviceFilter []string
	// AllDevices is `devices: all`; otherwise Devices lists GPU indexes.
	AllDevices bool
	Devices    []int
	MIGEnabled bool
	// MIGDevices counts MIG devices per GPU by profile, e.g. {"1g.5gb": 7}.
	MIGDevices map[string]int
}

// Names returns the config names, sorted.
func (c *MIGConfig) Names() []string {
	out := make([]string, 0, len(c.Configs))
	for n := range c.Configs {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

type rawMIGEntry struct {
	DeviceFilter json.RawMessage `json:"device-filter"`
	Devices      json.RawMessage `json:"devices"`
	MIGEnabled   *bool           `json:"mig-enabled"`
	MIGDevices   map[string]int  `json:"mig-devices"`
}

type rawMIGFile struct {
	MIGConfigs map[string][]rawMIGEntry `json:"mig-configs"`
}

// ParseMIGConfig reads a mig-parted config, given either as the file itself (version: v1,
// mig-configs: ...) or as the ConfigMap that holds it, in YAML or JSON as `kubectl get cm -o
// yaml` prints it: GPU Operator's default-mig-parted-config, or one's own.
func ParseMIGConfig(data []byte) (*MIGConfig, error) {
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("not YAML or JSON: %w", err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(j, &top); err != nil || top == nil {
		return nil, fmt.Errorf("expected a mig-parted config (a map with mig-configs:) or a ConfigMap holding one")
	}
	if _, ok := top["mig-configs"]; ok {
		return parseMIGFile(j)
	}
	var kind string
	_ = json.Unmarshal(top["kind"], &kind)
	switch kind {
	case "ConfigMap":
		var cm struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Data map[string]string `json:"data"`
		}
		if err := json.Unmarshal(j, &cm); err != nil {
			return nil, fmt.Errorf("ConfigMap: %w", err)
		}
		return configFromConfigMap(cm.Metadata.Name, cm.Data)
	case "List":
		var l struct {
			Items []struct {
				Kind string `json:"kind"`
			} `json:"items"`
		}
		var raw struct {
			Items []json.RawMessage `json:"items"`
		}
		if json.Unmarshal(j, &l) != nil || json.Unmarshal(j, &raw) != nil || len(l.Items) != 1 || l.Items[0].Kind != "ConfigMap" {
			var kinds []string
			for _, it := range l.Items {
				if !slices.Contains(kinds, it.Kind) {
					kinds = append(kinds, it.Kind)
				}
			}
			return nil, fmt.Errorf("a List of %d object(s) (kinds: %s), not one ConfigMap; pass the ConfigMap named in ClusterPolicy spec.migManager.config.name (GPU Operator's is %s)",
				len(l.Items), strings.Join(kinds, ", "), names.DefaultMIGPartedConfigMap)
		}
		return ParseMIGConfig(raw.Items[0])
	}
	return nil, fmt.Errorf("neither a mig-parted config (no mig-configs: key) nor a ConfigMap holding one under data.%s (kind %q)", names.MIGPartedConfigKey, kind)
}

func configFromConfigMap(name string, data map[string]string) (*MIGConfig, error) {
	key := names.MIGPartedConfigKey
	if _, ok := data[key]; !ok {
		// GPU Operator reads config.yaml; a ConfigMap with one other key is still clear.
		if len(data) != 1 {
			keys := slices.Sorted(func(yield func(string) bool) {
				for k := range data {
					if !yield(k) {
						return
					}
				}
			})
			return nil, fmt.Errorf("ConfigMap %q has no data.%s (keys: %s); mig-manager reads the config from data.%s", name, key, strings.Join(keys, ", "), key)
		}
		for k := range data {
			key = k
		}
	}
	cfg, err := ParseMIGConfig([]byte(data[key]))
	if err != nil {
		return nil, fmt.Errorf("ConfigMap %q data.%s: %w", name, key, err)
	}
	return cfg, nil
}

func parseMIGFile(j []byte) (*MIGConfig, error) {
	var raw rawMIGFile
	if err := json.Unmarshal(j, &raw); err != nil {
		return nil, fmt.Errorf("mig-configs: %w", err)
	}
	if len(raw.MIGConfigs) == 0 {
		return nil, fmt.Errorf("mig-configs is empty; a node's nvidia.com/mig.config label must name one of its entries")
	}
	cfg := &MIGConfig{Configs: map[string][]MIGEntry{}}
	for name, entries := range raw.MIGConfigs {
		for i, r := range entries {
			e, err := r.entry()
			if err != nil {
				return nil, fmt.Errorf("mig-configs.%s[%d].%w", name, i, err)
			}
			cfg.Configs[name] = append(cfg.Configs[name], e)
		}
	}
	return cfg, nil
}

func (r rawMIGEntry) entry() (MIGEntry, error) {
	var e MIGEntry
	if r.MIGEnabled == nil {
		return e, fmt.Errorf("mig-enabled: missing; mig-parted needs true or false")
	}
	e.MIGEnabled = *r.MIGEnabled
	var all string
	switch {
	case len(r.Devices) == 0:
		return e, fmt.Errorf("devices: missing; use all or a list of GPU indexes such as [0,1]")
	case json.Unmarshal(r.Devices, &all) == nil:
		if all != "all" {
			return e, fmt.Errorf("devices: %q is neither all nor a list of GPU indexes", all)
		}
		e.AllDevices = true
	case json.Unmarshal(r.Devices, &e.Devices) == nil:
		if slices.ContainsFunc(e.Devices, func(d int) bool { return d < 0 }) {
			return e, fmt.Errorf("devices: %v holds a negative GPU index", e.Devices)
		}
	default:
		return e, fmt.Errorf("devices: %s is neither all nor a list of GPU indexes", r.Devices)
	}
	if len(r.DeviceFilter) > 0 {
		var one string
		if json.Unmarshal(r.DeviceFilter, &one) == nil {
			e.DeviceFilter = []string{one}
		} else if err := json.Unmarshal(r.DeviceFilter, &e.DeviceFilter); err != nil {
			return e, fmt.Errorf("device-filter: %s is neither a PCI device id nor a list of them", r.DeviceFilter)
		}
	}
	for p, n := range r.MIGDevices {
		if n < 0 {
			return e, fmt.Errorf("mig-devices.%s: %d is negative", p, n)
		}
	}
	if e.MIGEnabled {
		e.MIGDevices = r.MIGDevices
	}
	return e, nil
}
