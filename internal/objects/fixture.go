package objects

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	apiserverinternalv1alpha1 "k8s.io/api/apiserverinternal/v1alpha1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// A fixture is a YAML stream of ordinary Kubernetes objects, the offline variant of what the
// inventory watches: Leases, StorageVersions, APIServices, CustomResourceDefinitions (name and
// creation time only), and kube-mvp.io/v1alpha1 APIServerDiscovery, one apiserver's own
// discovery (the one kind that is ours, because Kubernetes has no object for it). A list
// (kind: List, or any *List with items) is read item by item. The format:
// docs/testing.md#the-fixture-format.

// FixtureDiscoveryKind and FixtureAPIVersion name the fixture-only kind.
const (
	FixtureAPIVersion    = "kube-mvp.io/v1alpha1"
	FixtureDiscoveryKind = "APIServerDiscovery"
)

// APIServerDiscovery is the fixture form of one apiserver's discovery.
type APIServerDiscovery struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Discovery         apidiscoveryv2.APIGroupDiscoveryList `json:"discovery"`
}

// LoadFixture reads a fixture file.
func LoadFixture(path string) (Objects, error) {
	f, err := os.Open(path)
	if err != nil {
		return Objects{}, err
	}
	defer f.Close()
	objs, err := DecodeFixture(f)
	if err != nil {
		return Objects{}, fmt.Errorf("%s: %w", path, err)
	}
	return objs, nil
}

// DecodeFixture reads a fixture stream. Unlike Build, it is strict: a document it cannot
// decode, or of a kind it does not know, is an error naming that document, because a fixture
// is written by hand and a silent skip would hide a typo.
func DecodeFixture(r io.Reader) (Objects, error) {
	objs := Objects{Discovery: map[string]*apidiscoveryv2.APIGroupDiscoveryList{}}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(r))
	var errs []error
	for doc := 1; ; doc++ {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return objs, fmt.Errorf("document %d: %w", doc, err)
		}
		if len(bytes.TrimSpace(raw)) == 0 || isOnlyComments(raw) {
			continue
		}
		if err := decodeDocument(raw, &objs); err != nil {
			errs = append(errs, fmt.Errorf("document %d: %w", doc, err))
		}
	}
	return objs, errors.Join(errs...)
}

func isOnlyComments(raw []byte) bool {
	for line := range bytes.Lines(raw) {
		line = bytes.TrimSpace(line)
		if len(line) > 0 && line[0] != '#' {
			return false
		}
	}
	return true
}

func decodeDocument(raw []byte, objs *Objects) error {
	var head struct {
		metav1.TypeMeta `json:",inline"`
		Metadata        struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Items []rawDocument `json:"items"`
	}
	if err := yaml.Unmarshal(raw, &head); err != nil {
		return err
	}
	what := fmt.Sprintf("%s %s %q", head.APIVersion, head.Kind, head.Metadata.Name)
	strict := func(into any) error {
		if err := yaml.UnmarshalStrict(raw, into); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
	switch head.APIVersion + " " + head.Kind {
	case "coordination.k8s.io/v1 Lease":
		var l coordinationv1.Lease
		if err := strict(&l); err != nil {
			return err
		}
		objs.Leases = append(objs.Leases, l)
	case "internal.apiserver.k8s.io/v1alpha1 StorageVersion":
		var sv apiserverinternalv1alpha1.StorageVersion
		if err := strict(&sv); err != nil {
			return err
		}
		objs.StorageVersions = append(objs.StorageVersions, sv)
	case "apiregistration.k8s.io/v1 APIService":
		var s APIService
		if err := yaml.Unmarshal(raw, &s); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		objs.APIServices = append(objs.APIServices, s)
	case "apiextensions.k8s.io/v1 CustomResourceDefinition":
		// Only its name and creation time: what the inventory watches (metadata only).
		var crd metav1.PartialObjectMetadata
		if err := yaml.Unmarshal(raw, &crd); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		objs.CRDs = append(objs.CRDs, CRD{Name: crd.Name, Created: crd.CreationTimestamp.Time})
	case "v1 ConfigMap":
		var cm corev1.ConfigMap
		if err := strict(&cm); err != nil {
			return err
		}
		if cm.Namespace != AuthenticationNamespace || cm.Name != AuthenticationConfigMap {
			return fmt.Errorf("%s: the only ConfigMap read is %s/%s", what, AuthenticationNamespace, AuthenticationConfigMap)
		}
		objs.Authentication = &cm
	case FixtureAPIVersion + " " + FixtureDiscoveryKind:
		var d APIServerDiscovery
		if err := strict(&d); err != nil {
			return err
		}
		if d.Name == "" {
			return fmt.Errorf("%s: metadata.name must be the apiserver ID", what)
		}
		objs.Discovery[d.Name] = &d.Discovery
	default:
		if head.Items == nil {
			return fmt.Errorf("%s: unknown kind (want Lease, StorageVersion, APIService, "+
				"CustomResourceDefinition, %s/%s ConfigMap, %s or a List of them)", what, AuthenticationNamespace, AuthenticationConfigMap, FixtureDiscoveryKind)
		}
		var errs []error
		for i, item := range head.Items {
			if err := decodeDocument(item, objs); err != nil {
				errs = append(errs, fmt.Errorf("item %d: %w", i, err))
			}
		}
		return errors.Join(errs...)
	}
	return nil
}

// rawDocument keeps a list item undecoded until its kind is known.
type rawDocument []byte

func (j *rawDocument) UnmarshalJSON(b []byte) error {
	*j = append((*j)[:0], b...)
	return nil
}
