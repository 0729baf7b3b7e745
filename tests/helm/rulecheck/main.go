// Command rulecheck checks Prometheus rule files the way Prometheus loads them
// (rulefmt.Parse: known fields only, PromQL expressions, label and annotation templates) and
// exits 1 on any error. A file may be a plain rule file (`groups:` at the top) or a
// prometheus-operator PrometheusRule object, whose `spec` is checked. A *.json file is read as
// a Grafana dashboard: every panel query must parse as PromQL once Grafana's variables are
// replaced ($__rate_interval by 5m, any other $name by .*), and with -metrics FILE every metric
// it selects must be listed in FILE (one name per line). Built by tests/helm/build-rulecheck.sh
// against a pinned github.com/prometheus/prometheus.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"

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

type panel struct {
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

// unknown returns the flotilla_* metric names expr selects that known does not list (nothing
// when known is nil). Histogram series (_bucket, _sum, _count) count as their family.
func unknown(expr parser.Expr, known map[string]bool) []string {
	var out []string
	if known == nil {
		return nil
	}
	for _, vs := range parser.ExtractSelectors(expr) {
		for _, m := range vs {
			if m.Name != model.MetricNameLabel || !strings.HasPrefix(m.Value, "flotilla_") {
				continue
			}
			name := m.Value
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				name = strings.TrimSuffix(name, suffix)
			}
			if !known[name] && !known[m.Value] {
				out = append(out, m.Value)
			}
		}
	}
	return out
}

var grafanaVar = regexp.MustCompile(`\$\{?[A-Za-z_][A-Za-z0-9_]*\}?`)

// dashboard parses every query of a Grafana dashboard; known, if not nil, lists the metric
// names a query may select.
func dashboard(file string, p parser.Parser, known map[string]bool) (int, []error) {
	content, err := os.ReadFile(file)
	if err != nil {
		return 0, []error{err}
	}
	var d struct {
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(content, &d); err != nil {
		return 0, []error{err}
	}
	var errs []error
	n := 0
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, pl := range ps {
			for _, t := range pl.Targets {
				n++
				q := strings.ReplaceAll(t.Expr, "$__rate_interval", "5m")
				q = grafanaVar.ReplaceAllString(q, ".*")
				expr, err := p.ParseExpr(q)
				if err != nil {
					errs = append(errs, fmt.Errorf("panel %q: %q: %w", pl.Title, t.Expr, err))
					continue
				}
				for _, name := range unknown(expr, known) {
					errs = append(errs, fmt.Errorf("panel %q: metric %s is not exported", pl.Title, name))
				}
			}
			walk(pl.Panels)
		}
	}
	walk(d.Panels)
	return n, errs
}

func main() {
	metrics := flag.String("metrics", "", "file listing the metric names dashboards may use")
	flag.Parse()
	var known map[string]bool
	if *metrics != "" {
		content, err := os.ReadFile(*metrics)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		known = map[string]bool{}
		for _, l := range strings.Fields(string(content)) {
			known[l] = true
		}
	}
	failed := false
	p := parser.NewParser(parser.Options{})
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	for _, file := range flag.Args() {
		if strings.HasSuffix(file, ".json") {
			n, errs := dashboard(file, p, known)
			for _, err := range errs {
				fmt.Fprintf(os.Stderr, "%s: %v\n", file, err)
				failed = true
			}
			if len(errs) == 0 {
				if known != nil {
					fmt.Printf("%s: %d queries parse, every flotilla_* metric they select is exported\n", file, n)
				} else {
					fmt.Printf("%s: %d queries parse\n", file, n)
				}
			}
			continue
		}
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
				for _, r := range g.Rules {
					n++
					expr, err := p.ParseExpr(r.Expr)
					if err != nil {
						continue // rulefmt.Parse reported it
					}
					for _, name := range unknown(expr, known) {
						fmt.Fprintf(os.Stderr, "%s: rule %q: metric %s is not exported\n", file, r.Alert+r.Record, name)
						failed = true
					}
				}
			}
			fmt.Printf("%s: %d groups, %d rules\n", file, len(groups.Groups), n)
		}
	}
	if failed {
		os.Exit(1)
	}
}
