package chart

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// The knobs the ecosystem's charts share (GPU Operator, Kueue, Karpenter, cert-manager) reach
// the objects they are for, on the webhook and on both node DaemonSets; labels and
// annotations the chart relies on (selectors, scraping) cannot be overridden.
func TestStandardKnobsReachTheirObjects(t *testing.T) {
	out, err := render(t,
		"--set", "dra.enabled=true",
		"--set", "webhook.priorityClassName=system-cluster-critical",
		"--set-json", `webhook.podAnnotations={"team":"ml","prometheus.io/port":"1"}`,
		"--set-json", `webhook.podLabels={"team":"ml","app.kubernetes.io/component":"evil","app.kubernetes.io/instance":"evil"}`,
		"--set-json", `webhook.serviceAccount.annotations={"eks.amazonaws.com/role-arn":"arn:aws:iam::1:role/x"}`,
		"--set-json", `webhook.topologySpreadConstraints=[{"maxSkew":1,"topologyKey":"topology.kubernetes.io/zone","whenUnsatisfiable":"ScheduleAnyway","labelSelector":{"matchLabels":{"app.kubernetes.io/component":"webhook"}}}]`,
		"--set-json", `webhook.extraArgs=["--repin-qps=5"]`,
		"--set-json", `webhook.extraEnv=[{"name":"GOMAXPROCS","value":"2"}]`,
		"--set", "node.priorityClassName=gpu-critical",
		"--set-json", `node.podAnnotations={"team":"ml"}`,
		"--set-json", `node.podLabels={"team":"ml"}`,
		"--set-json", `node.serviceAccount.annotations={"iam":"x"}`,
		"--set-json", `node.extraArgs=["--log-level=debug"]`,
		"--set-json", `node.nri.extraArgs=["--log-level=debug"]`,
		"--set-json", `node.extraEnv=[{"name":"GODEBUG","value":"madvdontneed=1"}]`,
	)
	if err != nil {
		t.Fatal(err)
	}
	var deployments []appsv1.Deployment
	var daemonSets []appsv1.DaemonSet
	sas := map[string]corev1.ServiceAccount{}
	for _, d := range documents(out) {
		switch d["kind"] {
		case "Deployment":
			var o appsv1.Deployment
			into(t, d, &o)
			deployments = append(deployments, o)
		case "DaemonSet":
			var o appsv1.DaemonSet
			into(t, d, &o)
			daemonSets = append(daemonSets, o)
		case "ServiceAccount":
			var o corev1.ServiceAccount
			into(t, d, &o)
			sas[o.Name] = o
		}
	}
	if len(deployments) != 1 || len(daemonSets) != 2 {
		t.Fatalf("rendered %d Deployments and %d DaemonSets, want the webhook and both node DaemonSets", len(deployments), len(daemonSets))
	}
	w := deployments[0].Spec.Template
	if w.Spec.PriorityClassName != "system-cluster-critical" || len(w.Spec.TopologySpreadConstraints) != 1 {
		t.Errorf("webhook pod: priorityClassName %q, %d spread constraints", w.Spec.PriorityClassName, len(w.Spec.TopologySpreadConstraints))
	}
	if w.Labels["team"] != "ml" || w.Labels["app.kubernetes.io/component"] != "webhook" || w.Labels["app.kubernetes.io/instance"] != "nvdomain" {
		t.Errorf("webhook pod labels %v: the user's label must be added and the chart's selector labels kept", w.Labels)
	}
	if w.Annotations["team"] != "ml" || w.Annotations["prometheus.io/port"] != "8080" {
		t.Errorf("webhook pod annotations %v: the user's added, the scrape port kept", w.Annotations)
	}
	c := w.Spec.Containers[0]
	if !slices.Contains(c.Args, "--repin-qps=5") || c.Args[len(c.Args)-1] != "--repin-qps=5" {
		t.Errorf("webhook args %v: the extra flag must come last, so it wins", c.Args)
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "GOMAXPROCS" && e.Value == "2" }) {
		t.Errorf("webhook env %v lacks GOMAXPROCS", c.Env)
	}
	if sas["nvdomain-webhook"].Annotations["eks.amazonaws.com/role-arn"] == "" || sas["nvdomain-node"].Annotations["iam"] != "x" {
		t.Errorf("ServiceAccount annotations: webhook %v, node %v", sas["nvdomain-webhook"].Annotations, sas["nvdomain-node"].Annotations)
	}
	if sas["nvdomain-node"].Annotations["helm.sh/resource-policy"] != "keep" {
		t.Errorf("the node ServiceAccount lost the chart's keep annotation: %v", sas["nvdomain-node"].Annotations)
	}
	for _, ds := range daemonSets {
		p := ds.Spec.Template
		if p.Spec.PriorityClassName != "gpu-critical" || p.Labels["team"] != "ml" || p.Annotations["team"] != "ml" {
			t.Errorf("%s pod: priorityClassName %q, labels %v, annotations %v", ds.Name, p.Spec.PriorityClassName, p.Labels, p.Annotations)
		}
		for _, ctr := range p.Spec.Containers {
			if ctr.Args[len(ctr.Args)-1] != "--log-level=debug" {
				t.Errorf("%s container %s: args end %q, want the extra flag last", ds.Name, ctr.Name, ctr.Args[len(ctr.Args)-1])
			}
			if !slices.ContainsFunc(ctr.Env, func(e corev1.EnvVar) bool { return e.Name == "GODEBUG" }) {
				t.Errorf("%s container %s lacks the extra env", ds.Name, ctr.Name)
			}
		}
	}
	// Defaults: the node pods stay system-node-critical, the webhook keeps the cluster default.
	def, err := render(t)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(def, "priorityClassName: system-node-critical") || strings.Count(def, "priorityClassName:") != 2 {
		t.Errorf("default render: %d priorityClassName fields, want the node DaemonSet's and the uninstall Job's only", strings.Count(def, "priorityClassName:"))
	}
}
