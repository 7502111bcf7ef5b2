"""Remote islands on Ray: devices on other hosts, each owned by one actor, driven by this controller.

It owns both sides of that link: the actor that runs inside a Ray worker and
holds its host's arrays and executables, and the controller's client of it
(mailboxes that batch calls per island, remote arrays that stand for values
living there, remote calls and transfers that the plan's steps run).
"""
