package deploy

import (
	"reflect"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
)

func TestContainerImages(t *testing.T) {
	rendered := map[string]string{
		"kube-mvp/templates/NOTES.txt": "image: not/a-manifest:1\n",
		"kube-mvp/templates/b.yaml": `---
apiVersion: v1
kind: Service
metadata: {name: svc}
spec: {ports: [{port: 1}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: dep}
spec:
  template:
    spec:
      initContainers: [{name: init, image: "r/init:1"}]
      containers: [{name: a, image: "r/a:1"}, {name: b, image: "r/b:2"}]
`,
		"kube-mvp/templates/a.yaml": `apiVersion: batch/v1
kind: CronJob
metadata: {name: cron}
spec:
  schedule: "@daily"
  jobTemplate:
    spec:
      template:
        spec:
          containers: [{name: c, image: "r/c:3"}]
---
apiVersion: v1
kind: Pod
metadata: {name: pod}
spec:
  containers: [{name: p, image: "r/p:4"}]
`,
	}
	got, err := ContainerImages(rendered)
	if err != nil {
		t.Fatal(err)
	}
	want := []ContainerImage{
		{"CronJob", "cron", "c", "r/c:3"},
		{"Pod", "pod", "p", "r/p:4"},
		{"Deployment", "dep", "init:init", "r/init:1"},
		{"Deployment", "dep", "a", "r/a:1"},
		{"Deployment", "dep", "b", "r/b:2"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ContainerImages =\n%+v\nwant\n%+v", got, want)
	}
}

// RenderChart renders the real chart, values and all: by default the xds-server container runs
// ghcr.io/kube-mvp/xds-server at the chart's appVersion; image values replace both parts.
func TestRenderChartImages(t *testing.T) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		vals map[string]any
		want string
	}{
		{nil, "ghcr.io/kube-mvp/xds-server:" + ch.Metadata.AppVersion},
		{map[string]any{"image": map[string]any{"xdsServer": map[string]any{"repository": "registry.example.com/x/xds-server", "tag": "1.2.3"}}}, "registry.example.com/x/xds-server:1.2.3"},
	} {
		out, err := RenderChart(chartDir, release, "kube-mvp", c.vals)
		if err != nil {
			t.Fatal(err)
		}
		imgs, err := ContainerImages(out)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, img := range imgs {
			if img.Kind == "Deployment" && img.Name == fullname+"-xds-server" && img.Container == "xds-server" {
				got = append(got, img.Image)
			}
		}
		if len(got) != 1 || got[0] != c.want {
			t.Errorf("values %v: xds-server container images %q, want [%q]\nall: %+v", c.vals, got, c.want, imgs)
		}
	}
}
