package nvmltopo

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/go-logr/logr"
)

// wait is one answer of the mock event set's Wait.
type wait struct {
	e   nvml.EventData
	ret nvml.Return
}

// eventMachine is the HGX H100 mock with an event set whose Wait answers from waits (then
// times out), GPU 7 refusing event registration, and Init/Shutdown counted.
type eventMachine struct {
	*machine
	waits      chan wait
	registered map[int]uint64
	mu         sync.Mutex
	inits      int
}

func newEventMachine() *eventMachine {
	m := &eventMachine{machine: hgxH100(), waits: make(chan wait, 16), registered: map[int]uint64{}}
	set := &mock.EventSet{
		WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
			select {
			case w := <-m.waits:
				return w.e, w.ret
			case <-time.After(time.Duration(ms) * time.Millisecond / 20):
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
		},
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
	}
	m.srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS }
	init, shutdown := m.srv.InitFunc, m.srv.ShutdownFunc
	m.srv.InitFunc = func() nvml.Return { m.mu.Lock(); m.inits++; m.mu.Unlock(); return init() }
	m.srv.ShutdownFunc = func() nvml.Return { m.mu.Lock(); m.inits--; m.mu.Unlock(); return shutdown() }
	for i, d := range m.srv.Devices {
		dev := d.(*server.Device)
		dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return nvml.EventTypeAll, nvml.SUCCESS }
		dev.RegisterEventsFunc = func(mask uint64, _ nvml.EventSet) nvml.Return {
			if i == 7 {
				return nvml.ERROR_NOT_SUPPORTED
			}
			m.mu.Lock()
			m.registered[i] = mask
			m.mu.Unlock()
			return nvml.SUCCESS
		}
	}
	return m
}

func (m *eventMachine) xid(gpu int, xid uint64) wait {
	return wait{e: nvml.EventData{Device: m.srv.Devices[gpu], EventType: nvml.EventTypeXidCriticalError, EventData: xid}, ret: nvml.SUCCESS}
}

// A critical XID marks the GPU that raised it, in discovery's health, until the process ends;
// the XIDs an application causes, other event types, and repeats change nothing. An event NVML
// cannot attribute, or a lost GPU, marks every GPU (fail closed).
func TestXIDsMarkTheGPUThatRaisedThem(t *testing.T) {
	unknown := &mock.Device{GetUUIDFunc: func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }}
	cases := []struct {
		name    string
		waits   func(m *eventMachine) []wait
		ignored []uint64
		want    map[int]string // GPU → substring of its reason; absent: healthy
		all     string         // substring of every GPU's reason, instead of want
		signals int
		xids    []uint64 // the XIDs every marked GPU carries for the DRA driver's taints
		lost    bool     // every marked GPU carries Lost
	}{
		{name: "fallen off the bus", waits: func(m *eventMachine) []wait { return []wait{m.xid(3, 79)} },
			want: map[int]string{3: "XID 79 (the GPU has fallen off the bus) since "}, signals: 1, xids: []uint64{79}, lost: true},
		{name: "repeats and a second code", waits: func(m *eventMachine) []wait { return []wait{m.xid(3, 79), m.xid(3, 79), m.xid(3, 48)} },
			want: map[int]string{3: "XID 79 (the GPU has fallen off the bus), XID 48 (double-bit ECC error) since"}, signals: 2, xids: []uint64{79, 48}, lost: true},
		{name: "an application's page fault", waits: func(m *eventMachine) []wait { return []wait{m.xid(3, 31), m.xid(5, 13)} }},
		{name: "page faults not ignored", ignored: []uint64{}, waits: func(m *eventMachine) []wait { return []wait{m.xid(3, 31)} },
			want: map[int]string{3: "XID 31 since"}, signals: 1, xids: []uint64{31}},
		{name: "not a critical XID event", waits: func(m *eventMachine) []wait {
			return []wait{{e: nvml.EventData{Device: m.srv.Devices[3], EventType: nvml.EventTypeSingleBitEccError, EventData: 79}, ret: nvml.SUCCESS}}
		}},
		{name: "a device NVML cannot name", waits: func(*eventMachine) []wait {
			return []wait{{e: nvml.EventData{Device: unknown, EventType: nvml.EventTypeXidCriticalError, EventData: 74}, ret: nvml.SUCCESS}}
		}, all: "XID 74 (NVLink error) since", signals: 1, xids: []uint64{74}},
		{name: "a lost GPU", waits: func(*eventMachine) []wait { return []wait{{ret: nvml.ERROR_GPU_IS_LOST}} },
			all: "a GPU fell off the bus (NVML: GPU is lost) since", signals: 1, lost: true},
		{name: "a failing wait is no event", waits: func(*eventMachine) []wait { return []wait{{ret: nvml.ERROR_UNKNOWN}} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := newEventMachine()
			lib := m.lib()
			x := NewXIDs(lib, tc.ignored, logr.Discard())
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { x.Run(ctx); close(done) }()
			ws := tc.waits(m)
			for _, w := range ws {
				m.waits <- w
			}
			// Every answer taken, then one more wait: the last event is recorded.
			deadline := time.Now().Add(10 * time.Second)
			for len(m.waits) > 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			time.Sleep(200 * time.Millisecond)
			signals := 0
			for len(x.Changes()) > 0 {
				<-x.Changes()
				signals++
			}
			// The channel holds one signal; more marks in a row fold into it.
			if want := min(tc.signals, 1); signals != want {
				t.Errorf("%d change signals pending, want %d", signals, want)
			}
			o := m.opts(false)
			o.Marks = x.Problem
			top, err := Discover(ctx, lib, o)
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range top.GPUs {
				want, marked := tc.want[g.Index]
				if tc.all != "" {
					want, marked = tc.all, true
				}
				switch {
				case !marked && g.Unhealthy != "":
					t.Errorf("GPU %d marked: %q", g.Index, g.Unhealthy)
				case marked && !strings.Contains(g.Unhealthy, want):
					t.Errorf("GPU %d: %q, want it to contain %q", g.Index, g.Unhealthy, want)
				case marked && (!slices.Equal(g.XIDs, tc.xids) || g.Lost != tc.lost):
					t.Errorf("GPU %d: XIDs %v lost %v, want %v and %v", g.Index, g.XIDs, g.Lost, tc.xids, tc.lost)
				case !marked && (g.XIDs != nil || g.Lost):
					t.Errorf("unmarked GPU %d: XIDs %v lost %v", g.Index, g.XIDs, g.Lost)
				}
			}
			cancel()
			<-done
			m.mu.Lock()
			defer m.mu.Unlock()
			if m.inits != 0 {
				t.Errorf("NVML initialised %d more times than shut down", m.inits)
			}
			if len(m.registered) != 7 || m.registered[0] != nvml.EventTypeXidCriticalError {
				t.Errorf("registered %v, want the critical XID event on GPUs 0-6 (GPU 7 refuses)", m.registered)
			}
		})
	}
}

// A GPU off the bus fails discovery (NVML cannot open it), so the agent keeps its last good
// topology; the watcher's mark for that GPU alone, the one whose handle now answers "GPU is
// lost", reaches the kept topology through Overlay, once however often it is applied.
func TestAGPUOffTheBusIsMarkedOnTheKeptTopology(t *testing.T) {
	m := newEventMachine()
	var gone atomic.Bool
	dev := m.srv.Devices[2].(*server.Device)
	uuid := dev.UUID
	dev.GetUUIDFunc = func() (string, nvml.Return) {
		if gone.Load() {
			return "", nvml.ERROR_GPU_IS_LOST
		}
		return uuid, nvml.SUCCESS
	}
	lib := m.lib()
	kept, err := Discover(context.Background(), lib, m.opts(false))
	if err != nil {
		t.Fatal(err)
	}
	x := NewXIDs(lib, nil, logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go x.Run(ctx)
	waitUntil(t, "the watcher registered", func() bool { m.mu.Lock(); defer m.mu.Unlock(); return len(m.registered) == 7 })
	gone.Store(true)
	m.waits <- wait{ret: nvml.ERROR_GPU_IS_LOST}
	m.waits <- wait{ret: nvml.ERROR_GPU_IS_LOST} // answered at once, again: no spin, no second mark
	waitUntil(t, "GPU 2 marked", func() bool { return x.Mark(uuid) != "" })
	if _, err := Discover(ctx, lib, m.opts(false)); err == nil {
		t.Fatal("discovery of a machine with a GPU off the bus succeeded")
	}
	top := x.Overlay(kept)
	again := x.Overlay(top)
	if again != top {
		t.Error("a second overlay changed the kept topology again")
	}
	for _, g := range top.GPUs {
		switch {
		case g.Index == 2 && !strings.Contains(g.Unhealthy, "a GPU fell off the bus (NVML: GPU is lost) since"):
			t.Errorf("GPU 2: %q", g.Unhealthy)
		case g.Index != 2 && g.Unhealthy != "":
			t.Errorf("GPU %d marked too: %q", g.Index, g.Unhealthy)
		}
	}
	if kept.GPUs[2].Unhealthy != "" {
		t.Error("Overlay changed the topology it was given")
	}
}

// A watch that cannot be set up (the driver is not loaded yet when the node pod starts) is
// tried again until it can, and then records XIDs.
func TestTheXIDWatcherStartsOnceNVMLCan(t *testing.T) {
	m := newEventMachine()
	var fails atomic.Int32
	fails.Store(3)
	init := m.srv.InitFunc
	m.srv.InitFunc = func() nvml.Return {
		if fails.Add(-1) >= 0 {
			return nvml.ERROR_DRIVER_NOT_LOADED
		}
		return init()
	}
	lib := m.lib()
	x := NewXIDs(lib, nil, logr.Discard())
	x.retry = 10 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go x.Run(ctx)
	waitUntil(t, "the watcher registered after three failed starts", func() bool { m.mu.Lock(); defer m.mu.Unlock(); return len(m.registered) == 7 })
	m.waits <- m.xid(1, 79)
	uuid := m.srv.Devices[1].(*server.Device).UUID
	waitUntil(t, "GPU 1 marked", func() bool { return strings.Contains(x.Mark(uuid), "XID 79") })
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startWatch runs x until the test ends and waits until it registered GPUs 0-6.
func startWatch(t *testing.T, m *eventMachine, x *XIDs) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { x.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	waitUntil(t, "the watcher registered", func() bool { m.mu.Lock(); defer m.mu.Unlock(); return len(m.registered) == 7 })
}

// The marks outlive the node pod (a DaemonSet rollout, a crash) within one boot, and a boot
// clears them: a GPU that raised XID 48 is not placeable again after a restart (review DRA
// 5a). A marks file that cannot be parsed is an error and is left alone, so what it held is
// not overwritten.
func TestXIDMarksOutliveTheNodePodWithinOneBoot(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "xid-marks.json")
	m := newEventMachine()
	lib := m.lib()
	uuid3 := m.srv.Devices[3].(*server.Device).UUID
	uuid5 := m.srv.Devices[5].(*server.Device).UUID

	first := NewXIDs(lib, nil, logr.Discard())
	if err := first.Persist(file, "boot-a\n"); err != nil {
		t.Fatal(err)
	}
	startWatch(t, m, first)
	m.waits <- m.xid(3, 48)
	m.waits <- m.xid(3, 79)
	waitUntil(t, "GPU 3 marked twice", func() bool { return strings.Contains(first.Mark(uuid3), "XID 79") })

	cases := []struct {
		name string
		boot string
		// want: GPU 3's mark after the restart; "" when the restart clears it.
		want     Mark
		fileGone bool
	}{
		// XID 79 is a GPU off the bus: lost.
		{name: "a restart in the same boot", boot: "boot-a", want: Mark{XIDs: []uint64{48, 79}, Lost: true}},
		{name: "after a reboot", boot: "boot-b", fileGone: true},
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(file, data, 0o600); err != nil {
				t.Fatal(err)
			}
			next := NewXIDs(lib, nil, logr.Discard())
			if err := next.Persist(file, tc.boot); err != nil {
				t.Fatal(err)
			}
			got := next.Problem(uuid3)
			if tc.want.XIDs == nil {
				if got.Text != "" {
					t.Errorf("GPU 3 still marked after a reboot: %q", got.Text)
				}
			} else if !strings.Contains(got.Text, "XID 48 (double-bit ECC error), XID 79") || !slices.Equal(got.XIDs, tc.want.XIDs) || !got.Lost {
				t.Errorf("GPU 3 after the restart: %+v, want XIDs %v in the text and fields", got, tc.want.XIDs)
			}
			if next.Mark(uuid5) != "" {
				t.Errorf("GPU 5 marked: %q", next.Mark(uuid5))
			}
			if _, err := os.Stat(file); tc.fileGone != os.IsNotExist(err) {
				t.Errorf("marks file present = %v, want %v", err == nil, !tc.fileGone)
			}
		})
	}

	// A new mark of the restarted watcher is kept with the boot's id and the restored ones.
	t.Run("new marks are written with the old", func(t *testing.T) {
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
		m2 := newEventMachine()
		next := NewXIDs(m2.lib(), nil, logr.Discard())
		if err := next.Persist(file, "boot-a"); err != nil {
			t.Fatal(err)
		}
		startWatch(t, m2, next)
		m2.waits <- wait{ret: nvml.ERROR_GPU_IS_LOST}
		waitUntil(t, "every GPU marked lost", func() bool { return next.Problem(uuid5).Lost })
		var f marksFile
		raw, err := os.ReadFile(file)
		if err == nil {
			err = json.Unmarshal(raw, &f)
		}
		if err != nil {
			t.Fatal(err)
		}
		if f.BootID != "boot-a" || f.Marks[uuid3] == nil || !slices.Equal(f.Marks[uuid3].XIDs, []uint64{48, 79}) || f.Marks[allGPUs] == nil || !f.Marks[allGPUs].Lost {
			t.Errorf("marks file after a new mark: %s", raw)
		}
	})

	// A broken file is moved aside, and the marks are kept anew in its place: it must not turn
	// persistence off for every later start.
	t.Run("a file that cannot be parsed", func(t *testing.T) {
		if err := os.WriteFile(file, []byte("{not json"), 0o600); err != nil {
			t.Fatal(err)
		}
		next := NewXIDs(lib, nil, logr.Discard())
		err := next.Persist(file, "boot-a")
		if err == nil || !strings.Contains(err.Error(), file+".corrupt") {
			t.Fatalf("Persist over a broken file: %v, want an error naming where it went", err)
		}
		if raw, _ := os.ReadFile(file + ".corrupt"); string(raw) != "{not json" {
			t.Errorf("the broken file was not kept aside: %q", raw)
		}
		next.mark(uuid5, "XID 74", 74, false)
		if raw, _ := os.ReadFile(file); !strings.Contains(string(raw), "XID 74") {
			t.Errorf("a new mark after a broken file was not kept: %s", raw)
		}
	})
	// A save that fails (a read-only or full disk) is tried again until it succeeds.
	t.Run("a failed save is retried", func(t *testing.T) {
		sub := filepath.Join(t.TempDir(), "gone")
		next := NewXIDs(lib, nil, logr.Discard())
		if err := next.Persist(filepath.Join(sub, "marks.json"), "boot-a"); err != nil {
			t.Fatal(err)
		}
		next.mark(uuid5, "XID 74", 74, false) // the directory does not exist: the write fails
		if err := os.Mkdir(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		next.retrySave()
		if raw, _ := os.ReadFile(filepath.Join(sub, "marks.json")); !strings.Contains(string(raw), "XID 74") {
			t.Errorf("the retried save wrote %q", raw)
		}
	})
	if err := NewXIDs(lib, nil, logr.Discard()).Persist(file, " \n"); err == nil {
		t.Error("Persist without a boot id succeeded")
	}
}

// A wait that keeps failing with something other than a timeout (a dead event set) ends the
// watch, and the watcher starts NVML and its event set anew, then records XIDs again (review
// DRA 5b).
func TestADeadEventSetIsSetUpAnew(t *testing.T) {
	m := newEventMachine()
	var starts atomic.Int32
	init := m.srv.InitFunc
	m.srv.InitFunc = func() nvml.Return { starts.Add(1); return init() }
	lib := m.lib()
	x := NewXIDs(lib, nil, logr.Discard())
	x.retry, x.reinitAfter = 10*time.Millisecond, 3
	startWatch(t, m, x)
	for range 3 {
		m.waits <- wait{ret: nvml.ERROR_UNKNOWN}
	}
	waitUntil(t, "NVML started anew", func() bool { return starts.Load() >= 2 })
	m.waits <- m.xid(2, 48)
	uuid := m.srv.Devices[2].(*server.Device).UUID
	waitUntil(t, "GPU 2 marked after the new start", func() bool { return strings.Contains(x.Mark(uuid), "XID 48") })
	if p := x.Problem(uuid); !slices.Equal(p.XIDs, []uint64{48}) || p.Lost {
		t.Errorf("GPU 2's mark: %+v, want XID 48, not lost", p)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.inits != 1 {
		t.Errorf("NVML initialised %d times more than shut down, want 1 (the running watch)", m.inits)
	}
}
