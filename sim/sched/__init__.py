"""sim/sched"""
