"""What every server role shares and no client needs (DESIGN section 2): encryption at
rest so far (`kernel.encryption`). Server packages import it; `sms` (the client) never does.
"""
