SELECT agent_searches, followups, rate FROM followup_rate;
