import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
bad = [k for k in a if not torch.equal(a[k], b[k])]
print("same" if not bad else f"DIFFERENT: {bad}", len(a))
