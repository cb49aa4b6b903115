package names

import (
	"reflect"
	"strings"
	"testing"
)

func TestPodPinRoundTrip(t *testing.T) {
	n := Default()
	for _, pin := range []PodPin{
		{Domain: 1, TPSize: 4, ContainerGPUs: map[string]int{"vllm": 4}},
		{Domain: 0, ContainerGPUs: map[string]int{"a": 1, "b": 2}},
		{Domain: -1, TPSize: 8, ContainerGPUs: map[string]int{"trtllm": 8}}, // DRA: no domain
	} {
		ann := map[string]string{"team": "llm", n.PodDomainAnnotation(): "7"}
		n.EncodePin(ann, pin)
		got, err := n.DecodePin(ann)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, pin) {
			t.Errorf("round trip of %+v gave %+v (annotations %v)", pin, got, ann)
		}
		if ann["team"] != "llm" {
			t.Errorf("EncodePin touched another annotation: %v", ann)
		}
	}
}

func TestDecodePinNamesTheBadAnnotation(t *testing.T) {
	n := Default()
	cases := []struct {
		ann  map[string]string
		want string
	}{
		{map[string]string{n.PodDomainAnnotation(): "one"}, `annotation gpu.nvidia.com/nvswitch-domain="one" is not a domain id`},
		{map[string]string{n.PodDomainAnnotation(): "-2"}, "is not a domain id"},
		{map[string]string{n.PodTPSizeAnnotation(): "0"}, `annotation gpu.nvidia.com/tp-size="0" is not a tensor-parallel size`},
		{map[string]string{n.PodContainerGPUsAnnotation(): "vllm=4"}, "annotation gpu.nvidia.com/container-gpus is not a JSON map"},
		{map[string]string{n.PodContainerGPUsAnnotation(): `{"vllm":-1}`}, "gives container vllm -1 GPUs"},
	}
	for _, tc := range cases {
		if _, err := n.DecodePin(tc.ann); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.ann, err, tc.want)
		}
	}
	if pin, err := n.DecodePin(nil); err != nil || pin.Pinned() {
		t.Errorf("no annotations: %+v %v", pin, err)
	}
}
