package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"sigs.k8s.io/yaml"

	"github.com/kube-mvp/kube-mvp/internal/cli"
)

// outputValue is -o: text (tables, the default), json or yaml (the JSON's fields).
func outputValue(p *string) *cli.Value[string] {
	return cli.NewValue(p, "text", "text|json|yaml", func(s string) (string, error) {
		if s != "text" && s != "json" && s != "yaml" {
			return "", errors.New("is not text, json or yaml")
		}
		return s, nil
	})
}

// printStructured prints v as json or yaml; false for text, which the caller prints.
func printStructured(w io.Writer, v any, output string) bool {
	if output != "json" && output != "yaml" {
		return false
	}
	out, err := json.MarshalIndent(v, "", "  ")
	if err == nil && output == "yaml" {
		out, err = yaml.JSONToYAML(out)
	}
	if err != nil {
		panic(err) // plain structs of strings and numbers always marshal
	}
	fmt.Fprintf(w, "%s", out)
	if output == "json" {
		fmt.Fprintln(w)
	}
	return true
}
