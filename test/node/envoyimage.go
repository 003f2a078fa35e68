package node

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/kube-mvp/kube-mvp/test/node/standin"
)

// EnvoyImageEnv names the environment variable that gives the node an Envoy image archive
// (make test-node NODE_FLAGS=--envoy-image=FILE.tar sets it): a `docker save` or OCI archive
// of a real Envoy image, imported into the node's containerd and given to the chart as
// image.envoy. Unset, the node runs the stand-in's image (test/node/standin).
const EnvoyImageEnv = "KUBE_MVP_ENVOY_IMAGE"

// EnvoyImage is the archive of the Envoy image the node runs; "" is the stand-in's.
var EnvoyImage = os.Getenv(EnvoyImageEnv)

// envoyImage returns the Envoy image's reference and archive: EnvoyImage's, or the
// stand-in's (built and cached).
func envoyImage(ctx context.Context, log io.Writer) (ref, tarball string, err error) {
	if EnvoyImage == "" {
		return standin.Image(ctx, log)
	}
	ref, err = ImageArchiveRef(EnvoyImage)
	if err != nil {
		return "", "", fmt.Errorf("--envoy-image %s: %w", EnvoyImage, err)
	}
	fmt.Fprintf(log, "node: Envoy is %s from %s\n", ref, EnvoyImage)
	return ref, EnvoyImage, nil
}

// ImageArchiveRef reads the name an image archive gives its image, which `ctr images import`
// tags it with: a `docker save` archive's manifest.json RepoTags, or an OCI archive's
// index.json annotation io.containerd.image.name (else org.opencontainers.image.ref.name when
// it is a whole reference). An archive of several images is refused: which is Envoy?
func ImageArchiveRef(archive string) (string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var dockerManifest []struct{ RepoTags []string }
	var ociIndex struct {
		Manifests []struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	var sawDocker, sawOCI bool
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("not a tar archive: %w", err)
		}
		switch path.Clean(h.Name) {
		case "manifest.json":
			if err := json.NewDecoder(io.LimitReader(tr, 1<<20)).Decode(&dockerManifest); err != nil {
				return "", fmt.Errorf("manifest.json: %w", err)
			}
			sawDocker = true
		case "index.json":
			if err := json.NewDecoder(io.LimitReader(tr, 1<<20)).Decode(&ociIndex); err != nil {
				return "", fmt.Errorf("index.json: %w", err)
			}
			sawOCI = true
		}
	}
	var refs []string
	switch {
	case sawDocker:
		for _, m := range dockerManifest {
			refs = append(refs, m.RepoTags...)
		}
	case sawOCI:
		for _, m := range ociIndex.Manifests {
			if r := m.Annotations["io.containerd.image.name"]; r != "" {
				refs = append(refs, r)
			} else if r := m.Annotations["org.opencontainers.image.ref.name"]; strings.ContainsAny(r, "/:") {
				refs = append(refs, r)
			}
		}
	default:
		return "", errors.New("neither manifest.json (docker save) nor index.json (OCI) in it")
	}
	if len(refs) != 1 {
		return "", fmt.Errorf("it names %d images (%v); want one, tagged (docker save envoyproxy/envoy:v1.40.0 -o FILE.tar)", len(refs), refs)
	}
	return refs[0], nil
}
