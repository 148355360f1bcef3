"""What a study gives back: selection, SLOs, export, report, knob checks."""
