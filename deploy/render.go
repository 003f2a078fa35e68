package deploy

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	"sigs.k8s.io/yaml"
)

// RenderChart renders the chart in dir as `helm template --namespace namespace release dir`
// with vals would (vals checked against values.schema.json), returning each template's output
// by template name. Other packages use it to see what the chart deploys (tools/images checks
// that the chart's images are the ones it builds).
func RenderChart(dir, release, namespace string, vals map[string]any) (map[string]string, error) {
	return RenderChartFor(dir, release, namespace, vals)
}

// RenderChartFor is RenderChart for a cluster that also serves apiVersions (as `helm template
// --api-versions`: "monitoring.coreos.com/v1/PrometheusRule" or "monitoring.coreos.com/v1"),
// which the chart's "auto" values look for.
func RenderChartFor(dir, release, namespace string, vals map[string]any, apiVersions ...string) (map[string]string, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, err
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.APIVersions = append(caps.APIVersions, apiVersions...)
	rv, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{Name: release, Namespace: namespace, Revision: 1, IsInstall: true}, caps)
	if err != nil {
		return nil, err
	}
	return engine.Render(ch, rv)
}

// ContainerImage is a container of a rendered workload and its image.
type ContainerImage struct {
	Kind, Name string // the renderedWorkload, e.g. Deployment kmvp-kube-mvp-xds-server
	Container  string // "init:" prefixed for an init container
	Image      string
}

// renderedWorkload is what ContainerImages reads of a manifest: where each kind keeps its pod spec.
type renderedWorkload struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		renderedPodTemplate
		JobTemplate struct {
			Spec renderedPodTemplate `json:"spec"`
		} `json:"jobTemplate"`
		Containers     []renderedContainer `json:"containers"` // a Pod
		InitContainers []renderedContainer `json:"initContainers"`
	} `json:"spec"`
}

type renderedPodTemplate struct {
	Template struct {
		Spec struct {
			Containers     []renderedContainer `json:"containers"`
			InitContainers []renderedContainer `json:"initContainers"`
		} `json:"spec"`
	} `json:"template"`
}

type renderedContainer struct {
	Name  string `json:"name"`
	Image string `json:"image"`
}

// ContainerImages lists every container (and init container) of every Pod, Deployment,
// DaemonSet, StatefulSet, ReplicaSet, Job and CronJob in rendered templates (as RenderChart
// returns them), in template-name order.
func ContainerImages(rendered map[string]string) ([]ContainerImage, error) {
	var out []ContainerImage
	for _, tpl := range slices.Sorted(maps.Keys(rendered)) {
		if filepath.Ext(tpl) != ".yaml" && filepath.Ext(tpl) != ".yml" {
			continue // NOTES.txt, helpers
		}
		docs := releaseutil.SplitManifests(rendered[tpl])
		for _, key := range slices.SortedFunc(maps.Keys(docs), func(a, b string) int { return renderedDocIndex(a) - renderedDocIndex(b) }) {
			var w renderedWorkload
			if err := yaml.Unmarshal([]byte(docs[key]), &w); err != nil {
				return nil, fmt.Errorf("%s: %w", tpl, err)
			}
			var cs, inits []renderedContainer
			switch w.Kind {
			case "Pod":
				cs, inits = w.Spec.Containers, w.Spec.InitContainers
			case "Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job":
				cs, inits = w.Spec.Template.Spec.Containers, w.Spec.Template.Spec.InitContainers
			case "CronJob":
				s := w.Spec.JobTemplate.Spec.Template.Spec
				cs, inits = s.Containers, s.InitContainers
			default:
				continue
			}
			for _, c := range inits {
				out = append(out, ContainerImage{Kind: w.Kind, Name: w.Metadata.Name, Container: "init:" + c.Name, Image: c.Image})
			}
			for _, c := range cs {
				out = append(out, ContainerImage{Kind: w.Kind, Name: w.Metadata.Name, Container: c.Name, Image: c.Image})
			}
		}
	}
	return out, nil
}

// renderedDocIndex is n of releaseutil's "manifest-n" keys, so documents keep their order.
func renderedDocIndex(key string) int {
	var n int
	fmt.Sscanf(strings.TrimPrefix(key, "manifest-"), "%d", &n)
	return n
}
