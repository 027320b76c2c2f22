// Opens a target, picks a drafter and a coupler, streams text and prints the statistics.
//
//	go run ./examples/stream TRAINING_TEXT "PROMPT" [DRAFTER] [COUPLER]
package main

import (
	"fmt"
	"os"

	"specinfer"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintf(os.Stderr, "usage: %s TRAINING_TEXT PROMPT [DRAFTER] [COUPLER]\n", os.Args[0])
		os.Exit(2)
	}
	drafterName, couplerSpec := "ngram", "greedy"
	if len(os.Args) > 3 {
		drafterName = os.Args[3]
	}
	if len(os.Args) > 4 {
		couplerSpec = os.Args[4]
	}
	if err := run(os.Args[1], os.Args[2], drafterName, couplerSpec); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func run(corpus, prompt, drafterName, couplerSpec string) error {
	registry, err := specinfer.NewRegistry(0)
	if err != nil {
		return err
	}
	defer registry.Close()
	target, err := registry.OpenTarget("kgram", "path="+corpus+",k=6")
	if err != nil {
		return err
	}
	defer target.Close()
	drafter, err := registry.OpenDrafter(drafterName, "", target)
	if err != nil {
		return err
	}
	defer drafter.Close()
	coupler, err := specinfer.NewCoupler(couplerSpec)
	if err != nil {
		return err
	}
	defer coupler.Close()
	session, err := specinfer.NewSession(target, drafter, coupler, specinfer.DefaultSessionParams())
	if err != nil {
		return err
	}
	defer session.Close()

	if err := session.FeedText(prompt); err != nil {
		return err
	}
	for chunk, err := range session.Stream(200) {
		if err != nil {
			return err
		}
		fmt.Print(chunk)
	}
	st, err := session.Stats()
	if err != nil {
		return err
	}
	fmt.Printf("\n%d tokens, acceptance %.2f, %.2f tokens per target pass, %.0f tokens/s\n",
		st.NGenerated, st.AcceptanceRate, st.MeanAccepted, st.TokensPerSecond)
	return nil
}
