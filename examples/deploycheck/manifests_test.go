package deploycheck

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// manifests are the files checked, and the kinds each must hold, in order.
var manifests = map[string][]string{
	"../agenthold/deploy/daemonset.yaml": {"ConfigMap", "DaemonSet"},
	"../sidecar/deploy/pod.yaml":         {"Pod"},
}

// TestManifestsDecodeStrictly decodes every document with unknown and
// duplicate fields refused.
func TestManifestsDecodeStrictly(t *testing.T) {
	for path, kinds := range manifests {
		t.Run(filepath.Base(path), func(t *testing.T) {
			data, err := os.ReadFile(path)
			require.NoError(t, err)
			docs := documents(data)
			require.Len(t, docs, len(kinds), "documents")
			for i, doc := range docs {
				var head struct {
					Kind       string `json:"kind"`
					APIVersion string `json:"apiVersion"`
				}
				require.NoError(t, yaml.Unmarshal(doc, &head))
				require.Equal(t, kinds[i], head.Kind, "document %d", i)
				obj, ok := map[string]any{"ConfigMap": &corev1.ConfigMap{}, "DaemonSet": &appsv1.DaemonSet{}, "Pod": &corev1.Pod{}}[head.Kind]
				require.True(t, ok, "no type for kind %s", head.Kind)
				assert.NoError(t, yaml.UnmarshalStrict(doc, obj), "document %d (%s)", i, head.Kind)
			}
		})
	}
}

// TestStrictDecodingRefusesAMisspeltField: the check can fail.
func TestStrictDecodingRefusesAMisspeltField(t *testing.T) {
	doc := []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n    - name: c\n      image: i\n      securityContex: {privileged: false}\n")
	assert.Error(t, yaml.UnmarshalStrict(doc, &corev1.Pod{}))
}

// TestDaemonSet checks what the gateway needs of its Pod: the netns
// directory shared with the node both ways, the admin socket's directory
// on the node, the master key as a file from a Secret (not in the
// environment).
func TestDaemonSet(t *testing.T) {
	data, err := os.ReadFile("../agenthold/deploy/daemonset.yaml")
	require.NoError(t, err)
	var ds appsv1.DaemonSet
	require.NoError(t, yaml.UnmarshalStrict(documents(data)[1], &ds))
	spec := ds.Spec.Template.Spec
	require.Len(t, spec.Containers, 1)
	c := spec.Containers[0]
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	if m, ok := mounts["/run/netns"]; assert.True(t, ok, "no /run/netns mount") {
		require.NotNil(t, m.MountPropagation)
		assert.Equal(t, corev1.MountPropagationBidirectional, *m.MountPropagation)
	}
	assert.Contains(t, mounts, "/run/agenthold")
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	assert.Equal(t, "/run/netns", hostPaths[mounts["/run/netns"].Name])
	for _, e := range c.Env {
		assert.NotEqual(t, "AGENTHOLD_MASTER_KEY", e.Name, "the master key is in the environment")
	}
	var fromSecret bool
	for _, v := range spec.Volumes {
		if v.Secret != nil && v.Name == mounts["/etc/agenthold-key"].Name {
			fromSecret = true
		}
	}
	assert.True(t, fromSecret, "the master key is not a file from a Secret")
	assert.False(t, spec.HostNetwork, "the gateway takes the node's network namespace")
	assert.False(t, spec.HostPID, "the gateway sees the node's processes")
}

// documents splits a multi-document YAML stream.
func documents(data []byte) [][]byte {
	var out [][]byte
	for _, d := range bytes.Split(data, []byte("\n---\n")) {
		if len(bytes.TrimSpace(d)) > 0 {
			out = append(out, d)
		}
	}
	return out
}
