// Command rate: HTTP requests at a constant rate, latency from each request's scheduled send
// time (no coordinated omission), printed as one JSON object with the keys of
// bench/harness/rate.py. A Go client, because the Python one's own scheduling lateness reached
// tens of milliseconds at p99 on this box and counted as server latency.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	neturl "net/url"
	"os"
	"sort"
	"sync"
	"time"
)

type request struct {
	Method string          `json:"method"`
	Path   string          `json:"path"`
	Body   json.RawMessage `json:"body,omitempty"`
}

func readRequests(file, url string) ([]request, error) {
	if file == "" {
		return []request{{Method: "GET", Path: ""}}, nil
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []request
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 1<<20), 1<<24)
	for scanner.Scan() {
		line := bytes.TrimSpace(scanner.Bytes())
		if len(line) == 0 {
			continue
		}
		var r request
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, scanner.Err()
}

func percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	if i < 0 {
		i = 0
	}
	return sorted[i]
}

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

func main() {
	url := flag.String("url", "", "base URL (a request's path is appended; without -requests: GET it)")
	rate := flag.Float64("rate", 0, "requests per second")
	duration := flag.Float64("duration", 8, "measured seconds")
	warmup := flag.Float64("warmup", 1, "seconds at the same rate before measuring")
	connections := flag.Int("connections", 64, "keep-alive connections at most")
	file := flag.String("requests", "", "JSON lines {method, path, body?}, cycled through")
	flag.Parse()
	reqs, err := readRequests(*file, *url)
	base := *url
	if *file != "" { // the file's paths are absolute: keep the URL's scheme and host
		if u, perr := neturl.Parse(*url); perr == nil {
			base = u.Scheme + "://" + u.Host
		}
	}
	if err != nil || len(reqs) == 0 || *rate <= 0 {
		fmt.Fprintln(os.Stderr, "rate: bad arguments or requests file:", err)
		os.Exit(2)
	}
	client := &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: *connections, MaxConnsPerHost: *connections},
		Timeout:   30 * time.Second,
	}
	warm := int(*rate * *warmup)
	n := warm + int(*rate**duration)
	latency := make([]float64, n)
	late := make([]float64, n)
	status := make([]int, n)
	slots := make(chan struct{}, *connections)
	var wg sync.WaitGroup
	start := time.Now().Add(50 * time.Millisecond)
	for i := 0; i < n; i++ {
		due := start.Add(time.Duration(float64(i) / *rate * float64(time.Second)))
		if wait := time.Until(due); wait > 0 {
			time.Sleep(wait)
		}
		wg.Add(1)
		go func(i int, due time.Time) {
			defer wg.Done()
			late[i] = time.Since(due).Seconds()
			slots <- struct{}{}
			defer func() { <-slots }()
			r := reqs[i%len(reqs)]
			method := r.Method
			if method == "" {
				method = "GET"
			}
			var body io.Reader
			if len(r.Body) > 0 {
				body = bytes.NewReader(r.Body)
			}
			req, err := http.NewRequest(method, base+r.Path, body)
			if err != nil {
				status[i] = -1
				latency[i] = math.NaN()
				return
			}
			if body != nil {
				req.Header.Set("Content-Type", "application/json")
			}
			resp, err := client.Do(req)
			if err != nil {
				status[i] = -1
				latency[i] = math.NaN()
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			latency[i] = time.Since(due).Seconds()
			status[i] = resp.StatusCode
		}(i, due)
	}
	wg.Wait()
	finished := time.Now()
	var measured, lateness []float64
	bad, errors := 0, 0
	for i := warm; i < n; i++ {
		lateness = append(lateness, late[i]*1000)
		switch {
		case status[i] == -1:
			errors++
		case status[i] != 200:
			bad++
			measured = append(measured, latency[i]*1000)
		default:
			measured = append(measured, latency[i]*1000)
		}
	}
	sort.Float64s(measured)
	sort.Float64s(lateness)
	window := finished.Sub(start.Add(time.Duration(float64(warm) / *rate * float64(time.Second)))).Seconds()
	maxMs := math.NaN()
	if len(measured) > 0 {
		maxMs = measured[len(measured)-1]
	}
	out := map[string]any{
		"client":            "go",
		"rate":              *rate,
		"requests":          n - warm,
		"ok":                len(measured) - bad,
		"bad_status":        bad,
		"errors":            errors,
		"achieved_rps":      math.Round(float64(len(measured))/window*10) / 10,
		"p50_ms":            round3(percentile(measured, 0.50)),
		"p90_ms":            round3(percentile(measured, 0.90)),
		"p99_ms":            round3(percentile(measured, 0.99)),
		"p999_ms":           round3(percentile(measured, 0.999)),
		"max_ms":            round3(maxMs),
		"start_late_p50_ms": round3(percentile(lateness, 0.50)),
		"start_late_p99_ms": round3(percentile(lateness, 0.99)),
	}
	enc, _ := json.Marshal(out)
	fmt.Println(string(enc))
}
