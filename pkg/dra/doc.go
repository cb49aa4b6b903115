// Package dra is nvdomain's Dynamic Resource Allocation (DRA) driver, gpu.nvdomain.io: a
// kubelet plugin that publishes one node's GPUs as ResourceSlice devices and prepares the
// ResourceClaims the kube-scheduler allocated on them. The scheduler's structured-parameters
// allocator then picks a tensor-parallel pod's k GPUs inside one NVLink domain on any node
// (the ResourceClaimTemplate nvdomain-tp-<k> constrains its k devices to one value of the
// nvswitchDomain attribute); nothing is pinned in advance. docs/dra.md explains the mode.
//
// # Devices
//
// Devices is a pure function of the topology: one device per GPU, named gpu-<index>, with the
// attributes gpu.nvdomain.io/nvswitchDomain (the domain id, absent for a GPU in no domain),
// nvswitchDomainSize, index, uuid, productName and fabricClique (<cluster UUID>.<clique id>,
// multi-node NVLink only), and the capacity gpu.nvdomain.io/memory. The node agent calls
// Driver.SetTopology whenever it reloads its source, and the slices change when the devices do.
//
// # Preparing claims
//
// PrepareResourceClaims is idempotent. A claim in the checkpoint is restored from it;
// otherwise PrepareDevices (pure) computes the GPUs from the allocation, the claim's CDI spec
// is written, and only then the checkpoint, so a checkpointed claim always has its spec. The
// checkpoint (checkpoint.json in <kubelet root>/plugins/gpu.nvdomain.io) is a versioned
// document, apiVersion gpu.nvdomain.io/v1, kind DRACheckpoint, checked on read and replaced
// atomically. UnprepareResourceClaims removes the spec, then the checkpoint entry.
//
// # CDI device names
//
// Prepared devices reach the container runtime as fully qualified CDI device names, in one of
// two forms (Options.CDI). ParseCDIDevice reads both back; the NRI plugin's DRA verification
// relies on them.
//
//   - CDINvdomain (simulated GPUs, the default): gpu.nvdomain.io/gpu=<claim UID>-gpu-<index>,
//     one device per GPU, from the spec file gpu.nvdomain.io-gpu_<claim UID>.json that the
//     driver writes into its CDI spec directory for each claim. The id is the claim's UID (a
//     UUID: hexadecimal and dashes), "-", and the GPU's device name gpu-<index>, where index
//     is the GPU's NVML index on the node; split at the last "-gpu-". Each device carries
//     /dev/nvidia<minor> (major 195); the spec adds /dev/nvidiactl and
//     NVIDIA_VISIBLE_DEVICES=void once for the claim, as NVIDIA's specs do.
//   - CDINVIDIA (real GPUs): nvidia.com/gpu=<GPU UUID>, the device of NVIDIA's own spec that
//     nvidia-ctk generates on the node (nvidia.com/gpu=<index> when the topology source does
//     not know the UUID). The driver writes no spec.
package dra
