"""What a prefill costs: the MAC model (RidgeFill paper section 2.5), each prompt's cost record, the
budgets that set an arm's knob to a share of exact's MACs, and the prefill timer."""
