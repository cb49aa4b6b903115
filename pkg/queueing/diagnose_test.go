package queueing

import (
	"errors"
	"strings"
	"testing"

	"github.com/nvdomain/nvdomain/pkg/names"
)

func TestExcludes(t *testing.T) {
	n := names.Default()
	cases := []struct {
		name, config string
		want         bool
	}{
		{"the documented setting", KueueConfig(n), true},
		{"a shorter prefix covers it", "resources:\n  excludeResourcePrefixes: [\"nvidia.com/nvswitch-\"]\n", true},
		{"another prefix only", "resources:\n  excludeResourcePrefixes: [\"example.com/\"]\n", false},
		{"a longer prefix covers one domain only", "resources:\n  excludeResourcePrefixes: [\"nvidia.com/nvswitch-domain-0\"]\n", false},
		{"no resources section", "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n", false},
		{"an empty prefix is not a setting", "resources:\n  excludeResourcePrefixes: [\"\"]\n", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Excludes([]byte(tc.config), n)
			if err != nil || got != tc.want {
				t.Fatalf("Excludes = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
	if _, err := Excludes([]byte("resources: [unclosed"), n); err == nil {
		t.Fatal("a Configuration that does not parse gave no error")
	}
}

func TestInstallationWarnings(t *testing.T) {
	n := names.Default()
	good := []byte(KueueConfig(n))
	bad := []byte("integrations:\n  frameworks: [pod]\n")
	cases := []struct {
		name string
		in   Installation
		want []string // substrings, one per warning, in order
	}{
		{"Kueue not installed", Installation{}, nil},
		{"configured, nothing held back", Installation{Versions: []string{"v1beta1", "v1beta2"}, Config: good}, nil},
		{"too old for the watch", Installation{Versions: []string{"v1beta1"}, Config: good}, []string{"needs Kueue v0.15 or later"}},
		{"Configuration lacks the exclusion", Installation{Versions: []string{"v1beta2"}, Config: bad, ConfigFrom: "ConfigMap kueue-system/kueue-manager-config"},
			[]string{"ConfigMap kueue-system/kueue-manager-config does not exclude nvdomain's per-domain resources"}},
		{"Configuration unreadable, nothing held back", Installation{Versions: []string{"v1beta2"}, ConfigErr: errors.New("forbidden")}, []string{"could not be read (forbidden)"}},
		{"Configuration unreadable, Workloads held back: the evidence alone", Installation{Versions: []string{"v1beta2"}, ConfigErr: errors.New("forbidden"),
			Refused: []string{"a/1", "a/2", "a/3", "a/4", "a/5"}}, []string{"5 Kueue Workload(s) held back because their ClusterQueue does not cover nvdomain's per-domain resource: a/1, a/2, a/3, and 2 more"}},
		{"both", Installation{Versions: []string{"v1beta2"}, Config: bad, Refused: []string{"a/1"}}, []string{"does not exclude", "1 Kueue Workload(s) held back"}},
		{"garbage Configuration", Installation{Versions: []string{"v1beta2"}, Config: []byte("resources: [unclosed"), ConfigFrom: "X"}, []string{"in X does not parse"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.in.Warnings(n)
			if len(got) != len(tc.want) {
				t.Fatalf("%d warnings, want %d: %q", len(got), len(tc.want), got)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("warning %d %q lacks %q", i, got[i], w)
				}
				if strings.Contains(w, "exclude") || strings.Contains(w, "held back") || strings.Contains(w, "could not be read") {
					if !strings.Contains(got[i], "excludeResourcePrefixes") || !strings.Contains(got[i], n.DomainResourcePrefix()) {
						t.Errorf("warning %d does not name the fix: %q", i, got[i])
					}
				}
			}
		})
	}
}
