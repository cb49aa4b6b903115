package names

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// PodPin is what nvdomain records on a pod it admitted: the domain id it pinned the pod to
// (none in DRA mode, where the allocator chooses), the tensor-parallel size, and each
// container's GPUs. It is one codec for the three annotations, which the webhook writes and
// the validator, the re-pin controller, explain and the NRI plugin read: a field is added
// here, once.
type PodPin struct {
	// Domain is the pinned domain id, -1 for none.
	Domain int
	// TPSize is the tensor-parallel size, 0 when not recorded (a pod that is not TP).
	TPSize int
	// ContainerGPUs is each GPU container's count, by container name.
	ContainerGPUs map[string]int
}

// Pinned reports whether the pin names a domain.
func (p PodPin) Pinned() bool { return p.Domain >= 0 }

// EncodePin writes pin into annotations, which must not be nil: the domain annotation when
// pin names one (removed otherwise), the TP size when recorded, the per-container counts.
func (n Names) EncodePin(annotations map[string]string, pin PodPin) {
	if pin.Domain >= 0 {
		annotations[n.PodDomainAnnotation()] = strconv.Itoa(pin.Domain)
	} else {
		delete(annotations, n.PodDomainAnnotation())
	}
	if pin.TPSize > 0 {
		annotations[n.PodTPSizeAnnotation()] = strconv.Itoa(pin.TPSize)
	}
	per := pin.ContainerGPUs
	if per == nil {
		per = map[string]int{}
	}
	raw, _ := json.Marshal(per) // map[string]int cannot fail to marshal
	annotations[n.PodContainerGPUsAnnotation()] = string(raw)
}

// DecodePin reads the pin from a pod's annotations. A pod without a domain annotation gets
// Domain -1; annotations that cannot be read are an error naming the annotation and what it
// should hold, for a message to the user (only nvdomain writes them, so a bad value was
// written by hand).
func (n Names) DecodePin(annotations map[string]string) (PodPin, error) {
	pin := PodPin{Domain: -1}
	if ds, ok := annotations[n.PodDomainAnnotation()]; ok {
		d, err := strconv.Atoi(ds)
		if err != nil || d < 0 {
			return pin, fmt.Errorf("annotation %s=%q is not a domain id", n.PodDomainAnnotation(), ds)
		}
		pin.Domain = d
	}
	if ts, ok := annotations[n.PodTPSizeAnnotation()]; ok {
		k, err := strconv.Atoi(ts)
		if err != nil || k < 1 {
			return pin, fmt.Errorf("annotation %s=%q is not a tensor-parallel size", n.PodTPSizeAnnotation(), ts)
		}
		pin.TPSize = k
	}
	if raw := annotations[n.PodContainerGPUsAnnotation()]; raw != "" {
		per := map[string]int{}
		if err := json.Unmarshal([]byte(raw), &per); err != nil {
			return pin, fmt.Errorf("annotation %s is not a JSON map of container name to GPUs: %v", n.PodContainerGPUsAnnotation(), err)
		}
		for c, k := range per {
			if k < 0 {
				return pin, fmt.Errorf("annotation %s gives container %s %d GPUs", n.PodContainerGPUsAnnotation(), c, k)
			}
		}
		pin.ContainerGPUs = per
	}
	return pin, nil
}
