// Command rulecheck checks Prometheus rule files the way Prometheus loads them
// (rulefmt.Parse: known fields only, PromQL expressions, label and annotation templates) and
// exits 1 on any error. A file may be a plain rule file (`groups:` at the top) or a
// prometheus-operator PrometheusRule object, whose `spec` is checked. Built by
// tests/helm/build-rulecheck.sh against a pinned github.com/prometheus/prometheus.
package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
)

// rules returns the rule-file content of a file: the file itself, or a PrometheusRule's spec.
func rules(file string) ([]byte, error) {
	content, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var obj struct {
		Kind string    `yaml:"kind"`
		Spec yaml.Node `yaml:"spec"`
	}
	if err := yaml.Unmarshal(content, &obj); err != nil || obj.Kind != "PrometheusRule" {
		return content, nil
	}
	return yaml.Marshal(&obj.Spec)
}

func main() {
	failed := false
	p := parser.NewParser(parser.Options{})
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	for _, file := range os.Args[1:] {
		content, err := rules(file)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", file, err)
			failed = true
			continue
		}
		groups, errs := rulefmt.Parse(content, false, model.UTF8Validation, p, logger)
		for _, err := range errs {
			fmt.Fprintf(os.Stderr, "%s: %v\n", file, err)
			failed = true
		}
		if len(errs) == 0 {
			n := 0
			for _, g := range groups.Groups {
				n += len(g.Rules)
			}
			fmt.Printf("%s: %d groups, %d rules\n", file, len(groups.Groups), n)
		}
	}
	if failed {
		os.Exit(1)
	}
}
