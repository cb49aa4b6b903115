package source

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology/nvmltopo"
	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
)

// FromFile is the --source value for the topology JSON `nvdomain topology parse|discover -o
// json` prints (JSONFile).
const FromFile = "file"

// Flags choose a node's topology source. The node agent and the NRI plugin register the same
// flags with the same meaning, so one chart value drives both: --source nvml, topo-matrix,
// simulated or file, with the file each needs.
type Flags struct {
	Source         string
	TopoMatrixFile string
	SimulatedFile  string
	TopologyFile   string
	// NVMLLibrary is libnvidia-ml's path; empty: the usual places, then the loader's search.
	NVMLLibrary string
	// NVMLHealth marks GPUs NVML reports broken unhealthy (nvmltopo.Options).
	NVMLHealth bool
	// NVMLXIDs makes the agent watch NVML's critical XID events (nvmltopo.XIDs), which holds
	// NVML open; off by default. The NRI plugin watches none.
	NVMLXIDs bool
	// NVMLXIDIgnore are the XIDs the agent's watcher does not mark GPUs for (--nvml-xid-ignore;
	// nvmltopo.DefaultIgnoredXIDs by default). The NRI plugin watches none.
	NVMLXIDIgnore []uint64
	// NVMLXIDMarksFile keeps the watcher's marks across restarts of the node pod, keyed by
	// the boot id (--nvml-xid-marks-file; empty: in memory only). The NRI plugin watches none.
	NVMLXIDMarksFile string
}

// AddFlags registers the flags on fs, with def as --source's default.
func (f *Flags) AddFlags(fs *flag.FlagSet, def string) {
	f.Source = def
	fs.StringVar(&f.Source, "source", def, "topology source: nvml, topo-matrix (--topo-matrix-file), simulated (--simulated-file) or file (--topology-file)")
	fs.StringVar(&f.TopoMatrixFile, "topo-matrix-file", "", "saved `nvidia-smi topo -m` output (--source topo-matrix)")
	fs.StringVar(&f.SimulatedFile, "simulated-file", "", "simulated-topology document on disk (--source simulated)")
	fs.StringVar(&f.TopologyFile, "topology-file", "", "node topology JSON, as `nvdomain topology parse|discover -o json` prints it (--source file)")
	fs.StringVar(&f.NVMLLibrary, "nvml-library", "", "path of libnvidia-ml.so.1 (--source nvml); empty: the usual driver paths, then the loader's search")
	fs.BoolVar(&f.NVMLHealth, "nvml-health", true, "mark GPUs unhealthy whose NVLink fabric Fabric Manager has not registered, whose row remap failed, or (the agent) that raised a critical XID (--source nvml); DRA mode then taints their devices")
	fs.BoolVar(&f.NVMLXIDs, "nvml-xids", false, "the agent watches NVML's critical XID events and marks the GPU that raised one unhealthy until the node reboots (--source nvml, with --nvml-health); it holds NVML open, so an in-place GPU reset or a driver module unload needs the node pod gone first")
	// The chart passes it as $NVDOMAIN_XID_MARKS_FILE, which an older image pinned or rolled
	// back to ignores, where it would refuse an unknown flag.
	fs.StringVar(&f.NVMLXIDMarksFile, "nvml-xid-marks-file", os.Getenv("NVDOMAIN_XID_MARKS_FILE"), "($NVDOMAIN_XID_MARKS_FILE) file on the node where the XID watcher (--nvml-xids) keeps its marks, so a restart of the node pod does not make a GPU that raised a critical XID placeable again; keyed by the node's boot id, so a reboot clears it (empty: marks live in memory only)")
	f.NVMLXIDIgnore = slices.Clone(nvmltopo.DefaultIgnoredXIDs)
	fs.Func("nvml-xid-ignore", fmt.Sprintf("comma-separated XIDs the agent's watcher (--nvml-xids) does not mark a GPU unhealthy for; replaces the default, those an application causes and the memory events the GPU's state carries (default %s; \"none\" ignores none)", joinUints(nvmltopo.DefaultIgnoredXIDs)), func(v string) error {
		ids, err := parseXIDs(v)
		if err != nil {
			return err
		}
		f.NVMLXIDIgnore = ids
		return nil
	})
}

// parseXIDs reads --nvml-xid-ignore: XIDs separated by commas, or none.
func parseXIDs(v string) ([]uint64, error) {
	ids := []uint64{}
	switch strings.TrimSpace(v) {
	case "none":
		return ids, nil
	case "":
		return nil, fmt.Errorf("--nvml-xid-ignore is empty: give XIDs (e.g. %s, the default) or none", joinUints(nvmltopo.DefaultIgnoredXIDs))
	}
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		id, err := strconv.ParseUint(f, 10, 32)
		if err != nil || id == 0 {
			return nil, fmt.Errorf("--nvml-xid-ignore: %q is not an XID (a positive number, e.g. 13,31,43,45,68,109, or none)", f)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

func joinUints(ids []uint64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.FormatUint(id, 10)
	}
	return strings.Join(s, ",")
}

// Infer sets Source from the one file flag given when Source is empty: the NRI plugin's
// flags before --source named the source by the file alone.
func (f *Flags) Infer() {
	if f.Source != "" {
		return
	}
	switch {
	case f.TopologyFile != "":
		f.Source = FromFile
	case f.TopoMatrixFile != "":
		f.Source = names.SourceTopoMatrix
	case f.SimulatedFile != "":
		f.Source = names.SourceSimulated
	}
}

// Validate checks that the source is known and has its file; simulated may go without one
// when the caller has another way (the agent's ConfigMap), which it says with fileOptional.
func (f Flags) Validate(fileOptional bool) error {
	switch f.Source {
	case names.SourceNVML:
		return nil
	case names.SourceTopoMatrix:
		if f.TopoMatrixFile == "" {
			return fmt.Errorf("--source topo-matrix needs --topo-matrix-file")
		}
		return nil
	case names.SourceSimulated:
		if f.SimulatedFile == "" && !fileOptional {
			return fmt.Errorf("--source simulated needs --simulated-file")
		}
		return nil
	case FromFile:
		if f.TopologyFile == "" {
			return fmt.Errorf("--source file needs --topology-file")
		}
		return nil
	case "":
		return fmt.Errorf("no topology source: give --source nvml, topo-matrix, simulated or file")
	}
	return fmt.Errorf("--source %q: use nvml, topo-matrix, simulated or file", f.Source)
}

// Open returns the source for node, or nil for simulated without --simulated-file (the
// caller's own source then). It validates first. labels, when given, lets a simulated
// document describe the node through a pool (Resolve).
func (f Flags) Open(node string, labels NodeLabels) (Source, error) {
	if err := f.Validate(true); err != nil {
		return nil, err
	}
	switch f.Source {
	case names.SourceNVML:
		return NVML{Lib: nvmltopo.Library(f.NVMLLibrary), NoHealth: !f.NVMLHealth}, nil
	case names.SourceTopoMatrix:
		return TopoMatrixFile{Path: f.TopoMatrixFile}, nil
	case FromFile:
		return JSONFile{Path: f.TopologyFile}, nil
	}
	if f.SimulatedFile == "" {
		return nil, nil
	}
	p, err := simulated.NewParser()
	if err != nil {
		return nil, err
	}
	return SimulatedFile{Path: f.SimulatedFile, Node: node, Parser: p, NodeLabels: labels}, nil
}
